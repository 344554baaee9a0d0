"""Fingerprints of a fine-tuning run, so `finetune --resume` continues only the run its checkpoint
belongs to, and the random-number state a checkpoint carries so the resumed run replays exactly
what the uninterrupted one would have done.

A run's fingerprint has four parts, each compared on resume:

  model       the model fine-tuning started from: its architecture (the config with layer names
              canonicalised, kernel records included), the kernels of its swapped layers, and a
              hash of its starting weights;
  training / validation data
              count, shapes and dtypes, and a SHA-256 of the labels and of up to 64 evenly spaced
              samples (arrays), or of the image folder's file list and sizes; a tf.data dataset
              is described by its element spec and size only (its content is not read);
  settings    batch size, learning rate, optimizer, seed, validation split.

The epoch count is recorded but not compared: `--resume --epochs N` with a larger N is how a run
is extended.  Differences are reported in words, all at once (see `differences`).

The random-number state (`rng_state` / `restore_rng_state`): Python's and NumPy's global
generators and the state of every Keras SeedGenerator in the model (Dropout and other random
layers keep theirs in a variable Keras does not save in a .keras file).
"""

from __future__ import annotations

import hashlib
import json
import os
import random

import keras
import numpy as np

from graphswap.errors import CheckpointError
from graphswap.swap import iter_layers
from graphswap.swap.subclassed import held_layers, is_subclassed

SAMPLE_ROWS = 64


def _sha(payload) -> str:
    data = payload if isinstance(payload, bytes) else json.dumps(payload, sort_keys=True,
                                                                  default=str).encode()
    return hashlib.sha256(data).hexdigest()


def _canonical_names(config):
    """`config` with every layer/model name replaced by its order of first appearance, so that
    auto-generated names ("dense_3" in one session, "dense" in another) do not count, and without
    the swapped layers' kernel records (compared separately)."""
    names: dict[str, str] = {}

    def collect(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "name" and isinstance(value, str) and value not in names:
                    names[value] = f"#{len(names)}"
                collect(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                collect(value)

    def replace(node):
        if isinstance(node, dict):  # kernel records are compared on their own
            return {key: replace(value) for key, value in node.items()
                    if key not in ("arithmetic", "swap_kernel")}
        if isinstance(node, (list, tuple)):
            return [replace(value) for value in node]
        return names.get(node, node) if isinstance(node, str) else node

    collect(config)
    return replace(config)


def iter_swapped_layers(model):
    """(path, layer) of every swapped layer in `model`, those held inside custom layers and
    wrappers (a transformer block, Bidirectional) included; a swapped layer's own projections
    and cells are part of it, not listed again."""
    def visit(path, layer):
        if hasattr(layer, "arithmetic"):
            yield path, layer
        elif not isinstance(layer, keras.Model) or is_subclassed(layer):
            for _, inner in held_layers(layer):
                yield from visit(f"{path}/{inner.name}", inner)

    for path, layer in iter_layers(model):
        yield from visit(path, layer)


def model_fingerprint(model) -> dict:
    """The model part of a run's fingerprint (see the module docstring)."""
    try:
        config = model.get_config()
    except Exception:  # noqa: BLE001 - a model without a config is described by its layers
        config = [type(layer).__name__ for _, layer in iter_layers(model)]
    # the swapped layers inside custom layers too: their kernels are not in the model's config
    kernels = [layer.arithmetic.to_config() for _, layer in iter_swapped_layers(model)]
    weights = hashlib.sha256()
    for value in model.get_weights():
        value = np.ascontiguousarray(value)
        weights.update(f"{value.dtype}{value.shape}".encode())
        weights.update(value.tobytes())
    return {"name": model.name, "architecture": _sha(_canonical_names(config)),
            "kernels": sorted({k["spec"] for k in kernels}), "kernel_records": _sha(kernels),
            "weights": weights.hexdigest(), "weight_count": int(model.count_params())}


def data_fingerprint(data) -> dict | None:
    """The data part of a run's fingerprint (a graphswap.research.data.data.Data, or None)."""
    if data is None:
        return None
    described = {"source": data.source, "count": data.count, "scale": data.scale}
    if data.x is not None:
        y = data.y
        if isinstance(y, (tuple, list)):  # several outputs: their labels side by side
            y = np.concatenate([np.asarray(part, np.float64).reshape(len(part), -1)
                                for part in y], axis=1)
        x, y = np.ascontiguousarray(data.x), np.ascontiguousarray(y)
        rows = np.unique(np.linspace(0, len(x) - 1, min(len(x), SAMPLE_ROWS)).astype(np.int64))
        digest = hashlib.sha256(f"{x.shape}{x.dtype}{y.shape}{y.dtype}".encode())
        digest.update(np.ascontiguousarray(x[rows]).tobytes())
        digest.update(y.tobytes())
        described.update(inputs=f"{tuple(x.shape)} {x.dtype}", labels=f"{tuple(y.shape)} {y.dtype}",
                         sha256=digest.hexdigest())
    elif data.directory is not None:
        listing = []
        for root, dirs, files in os.walk(data.directory):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                listing.append([os.path.relpath(path, data.directory), os.path.getsize(path)])
        described.update(inputs=f"image folder, {len(listing)} files", sha256=_sha(listing))
    else:
        spec = getattr(data.dataset, "element_spec", None)
        described.update(inputs=f"tf.data dataset {spec}", sha256=_sha(str(spec)))
    return described


def settings_fingerprint(*, epochs, batch_size, learning_rate, optimizer, seed, val_split,
                         schedule=None) -> dict:
    """The settings part of a run's fingerprint."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        config = dict(keras.optimizers.serialize(optimizer).get("config", {}))
        config.pop("name", None)
        optimizer = f"{type(optimizer).__name__} {json.dumps(config, sort_keys=True, default=str)}"
    return {"epochs": epochs, "batch size": batch_size, "learning rate": learning_rate,
            "optimizer": str(optimizer), "seed": seed, "validation split": val_split,
            "schedule": schedule}


def run_fingerprint(model, train, validation, settings: dict) -> dict:
    return {"model": model_fingerprint(model), "training data": data_fingerprint(train),
            "validation data": data_fingerprint(validation), "settings": settings}


def _describe_data(data: dict | None) -> str:
    if data is None:
        return "none"
    return (f"{data.get('count')} examples, inputs {data.get('inputs')}, from {data.get('source')}, "
            f"content sha256 {str(data.get('sha256'))[:12]}")


def differences(saved: dict, current: dict) -> list[str]:
    """What differs between the fingerprint a checkpoint recorded and this run's, in words."""
    found = []
    old, new = saved.get("model") or {}, current["model"]
    if old.get("kernels") != new["kernels"]:
        found.append(f"the kernels differ (checkpointed: "
                     f"{', '.join(old.get('kernels') or []) or 'none'}; now: "
                     f"{', '.join(new['kernels']) or 'none'})")
    elif old.get("kernel_records") != new["kernel_records"]:
        found.append("the kernels differ (the same names, but other layers use them or the "
                     "files changed)")
    if old.get("architecture") != new["architecture"]:
        found.append(f"the model's architecture differs (checkpointed {old.get('name')!r}, "
                     f"{old.get('weight_count')} weights; now {new['name']!r}, "
                     f"{new['weight_count']} weights)")
    elif old.get("weights") != new["weights"]:
        found.append(f"the model's starting weights differ (another model file with the same "
                     f"architecture: checkpointed {old.get('name')!r}, now {new['name']!r})")
    for part in ("training data", "validation data"):
        before, now = saved.get(part), current[part]
        if (before is None) != (now is None) or (before is not None and (
                before.get("sha256") != now.get("sha256") or before.get("count") != now.get("count")
                or before.get("scale") != now.get("scale"))):
            found.append(f"the {part} differ (checkpointed: {_describe_data(before)}; now: "
                         f"{_describe_data(now)})")
    before, now = saved.get("settings") or {}, current["settings"]
    for key, value in now.items():
        if key != "epochs" and before.get(key) != value:
            found.append(f"{key}: checkpointed {before.get(key)}, now {value}")
    return found


def check_same_run(saved: dict | None, current: dict, directory) -> list[str]:
    """Raise CheckpointError when the checkpoint in `directory` belongs to another run; returns
    notes (an old checkpoint without a fingerprint cannot be checked)."""
    if not saved:
        return [f"the checkpoint in {directory} records no fingerprint (written by an older "
                f"graphswap): cannot check that it belongs to this run"]
    found = differences(saved, current)
    if found:
        raise CheckpointError(
            f"the checkpoint in {directory} belongs to another run, so resuming would train "
            f"something else than you asked for: {'; '.join(found)}. Resume with the arguments "
            f"of the checkpointed run, start over with --force (force=True) instead of --resume, "
            f"or choose another --checkpoint-dir")
    notes = []
    epochs = (saved.get("settings") or {}).get("epochs")
    if epochs is not None and epochs != current["settings"]["epochs"]:
        notes.append(f"the checkpointed run asked for {epochs} epoch(s); continuing up to "
                     f"{current['settings']['epochs']}")
    return notes


# --------------------------------------------------------------------------------------------
# random-number state
# --------------------------------------------------------------------------------------------

def _seed_states(model) -> list:
    return [v for v in model.non_trainable_variables if v.path.endswith("seed_generator_state")]


def rng_state(model) -> dict:
    """The random-number state to carry in a checkpoint (JSON-serialisable)."""
    version, internal, gauss = random.getstate()
    name, keys, position, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [name, keys.tolist(), int(position), int(has_gauss), float(cached)],
            "seed_generators": [[v.path, np.asarray(v.numpy()).tolist()]
                                for v in _seed_states(model)]}


def restore_rng_state(model, saved: dict | None) -> list[str]:
    """Put the random-number state of a checkpoint back; returns notes."""
    if not saved:
        return ["the checkpoint carries no random-number state (written by an older graphswap): "
                "dropout masks and other random draws after resuming differ from an "
                "uninterrupted run"]
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, cached = saved["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    variables = _seed_states(model)
    recorded = saved.get("seed_generators", [])
    # matched in order: a SeedGenerator's name depends on how many were made before it in the
    # process ("seed_generator_3"), its place in the model does not
    if len(variables) != len(recorded):
        raise CheckpointError(
            f"the checkpoint's random-number state names {len(recorded)} seed generator(s) but "
            f"the checkpointed model has {len(variables)}; the checkpoint is inconsistent - start "
            f"over with --force")
    for variable, (_, value) in zip(variables, recorded):
        variable.assign(np.asarray(value, dtype=np.asarray(variable.numpy()).dtype))
    return []
