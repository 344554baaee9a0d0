"""Writing a model: one function for every model output graphswap writes (convert, finetune).

The path decides the format (graphswap.io.paths.model_output_format): `.keras` (Keras 3 archive),
`.h5` (legacy HDF5), or a graphswap SavedModel directory - a path without a suffix or ending in
'/' - that serves without graphswap and reopens in graphswap (graphswap.io.dual_savedmodel).
Every write is atomic (a temporary file or directory renamed into place) and replaces an existing
output only with `force`.
"""

from __future__ import annotations

from pathlib import Path

from graphswap.io.paths import atomic_output, model_output_format
from graphswap.io.savedmodel import export_saved_model


def save_model(model, path, force: bool = False, check_batch: int = 8,
               sequence_length=None) -> Path:
    """Save `model` to `path` as .keras, .h5 or a graphswap SavedModel directory (by the path).

    A SavedModel is verified on a sample batch of `check_batch` (free dimensions at
    `sequence_length`) before it is renamed into place (see export_saved_model)."""
    fmt = model_output_format(path)
    path = Path(path)
    if fmt == "savedmodel":
        export_saved_model(model, path, force=force, check_batch=check_batch,
                           sequence_length=sequence_length)
        return path
    with atomic_output(path, force) as tmp:
        model.save(tmp)
    return path
