"""`convert`: load a model, rewrite it, check it against the original, save it - the whole
`graphswap convert` command as one API function returning a result the CLI only prints.

It sits in io/ (not swap/) because it reads and writes files; the rewriting itself is
graphswap.swap.rewrite_model.  A model that is already rewritten (a rewritten .keras, a graphswap
SavedModel) is re-rewritten: its swapped layers are lowered first, the selection applies to them
like to any Dense/Conv2D, and the swapped layers the selection leaves out keep their kernel.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from graphswap.errors import GraphswapError
from graphswap.io.dual_savedmodel import is_graphswap_saved_model
from graphswap.io.load import load_model
from graphswap.io.lowering import lower_model
from graphswap.io.paths import check_model_output_path, default_output_path
from graphswap.io.saving import save_model
from graphswap.swap import (OriginalCannotRunError, RewriteReport, calibration_inputs,
                            counting_length, free_dimension_length, has_free_dimensions,
                            is_swapped, iter_layers, max_output_difference, rewrite_model,
                            sample_inputs, transform_model, validate_check_batch)


@dataclasses.dataclass
class ConvertResult:
    """What `convert` did: the rewritten model, its report, the check, where it was written."""

    model: object
    report: RewriteReport
    output: Path | None
    check_batch: int
    max_abs_difference: float | None      # None when the check was skipped or not asked for
    note: str | None = None               # why the check was skipped
    checked_on: str = "a random batch"    # what the outputs were compared on
    notes: tuple = ()                     # what changed beyond the layers (compile settings)

    def to_dict(self) -> dict:
        payload = self.report.to_dict()
        payload.update({"output": str(self.output) if self.output else None,
                        "max_abs_difference": self.max_abs_difference,
                        "checked_on": self.checked_on})
        if self.note:
            payload["note"] = self.note
        if self.notes:
            payload["notes"] = list(self.notes)
        return payload

    def format_text(self) -> str:
        lines = [self.report.format_table()]
        if self.max_abs_difference is not None:
            lines.append(f"max |original - rewritten| on {self.checked_on}: "
                         f"{self.max_abs_difference:.3g}")
        if self.note:
            lines.append(self.note)
        lines.extend(self.notes)
        if self.output is not None:
            lines.append(f"wrote {self.output}")
        return "\n".join(lines)


def convert(model, kernel=None, *, kernel_map=None, include=None, exclude=None,
            layer_types=None, backward: str = "native", check_batch: int = 8,
            output=None, force: bool = False, custom_objects=None,
            safe_mode: bool = True, inplace: bool = False, rewrite_options=None,
            sequence_length=None) -> ConvertResult:
    """Rewrite `model` (a path, or a keras.Model) so its selected layers run `kernel`.

    `kernel` defaults to "exact", or to none when a `kernel_map` is given (see rewrite_model for
    the selection arguments).  The rewritten model is compared with the original on a random
    batch of `check_batch` (0: skip; calibrated models: see below) and, if `output` is given - or
    `model` is a path, then beside it as MODEL.swapped.keras (MODEL_swapped_savedmodel/ for a
    graphswap SavedModel) - saved there atomically as .keras, .h5 or a SavedModel directory, by
    the path (`force` to replace an existing output).  Layers that are already swapped are
    re-rewritten when selected and keep their kernel otherwise.  Raises GraphswapError when no layer is selected: an
    unchanged copy is not a conversion.  `inplace` (subclassed models without get_config only;
    see rewrite_model) swaps the loaded model's own layers - with a path it is the freshly loaded
    copy, never the file.  `rewrite_options` are rewrite_model's quantization, calibration and
    folding arguments (quantization, calibration_data as arrays, calibration_samples,
    calibration_method, calibration_source, bias_correction, recalibrate_bn, fold_batchnorm).
    `sequence_length`: the length free (None) input dimensions take in the random check batch
    and in the report's MAC count (None: the calibration data's, else
    graphswap.swap.DEFAULT_SEQUENCE_LENGTH).
    """
    source = Path(model) if isinstance(model, (str, os.PathLike)) else None
    check_batch = validate_check_batch(check_batch)
    if output is None and source is not None:
        output = default_output_path(source, "convert",
                                     directory=is_graphswap_saved_model(source))
    if output is not None:
        output = check_model_output_path(output, force, inputs=[source])
    if kernel is None and kernel_map is None:
        kernel = "exact"
    original = load_model(source, custom_objects=custom_objects, safe_mode=safe_mode) \
        if source is not None else model
    previous = {path: layer for path, layer in iter_layers(original) if is_swapped(layer)}
    base = lower_model(original)[0] if previous else original
    length = free_dimension_length(original, (rewrite_options or {}).get("calibration_data"),
                                   sequence_length)
    with counting_length(length):
        swapped, report = rewrite_model(base, kernel=kernel, include=include, exclude=exclude,
                                        kernel_map=kernel_map, layer_types=layer_types,
                                        backward=backward, return_report=True,
                                        inplace=inplace, **(rewrite_options or {}))
    if previous:
        swapped = _keep_unselected_kernels(swapped, report, previous)
    if not report.swapped:
        shown = source if source is not None else f"model {original.name!r}"
        raise GraphswapError(
            f"nothing to swap in {shown}: no swappable layer was selected "
            f"({len(report.layers)} layers inspected); see 'graphswap inspect MODEL'")
    difference, note, checked_on = None, None, "a random batch"
    if check_batch > 0:
        batch, checked_on = _comparison_batch(original, check_batch, rewrite_options, length)
        try:
            difference = max_output_difference(original, swapped, batch)
        except OriginalCannotRunError as exc:
            note = f"comparison with the original skipped: {exc}"
    if output is not None:
        save_model(swapped, output, force=force, check_batch=max(check_batch, 1),
                   sequence_length=length)
    return ConvertResult(swapped, report, output, check_batch, difference, note, checked_on,
                         _compile_notes(original, swapped))


def _compile_notes(original, swapped) -> tuple:
    """What the rewritten model's compile settings dropped: XLA (swapped layers run outside it,
    graphswap/swap/xla.py), so the saved file reloads and runs without Keras's fallback warning."""
    if not getattr(original, "compiled", False) or not getattr(swapped, "compiled", False):
        return ()
    if original.get_compile_config().get("jit_compile") is True and \
            swapped.get_compile_config().get("jit_compile") is not True:
        return ("the original is compiled with jit_compile=True (XLA); the swapped layers run "
                "their kernels outside XLA, so the rewritten model is compiled and saved with "
                "jit_compile=False",)
    return ()


def _comparison_batch(original, check_batch: int, rewrite_options, length: int) -> tuple:
    """(inputs, what they are) for comparing the rewritten model with the original: the first
    `check_batch` calibration examples when calibration data was given, else a random batch (free
    dimensions at `length`)."""
    data = (rewrite_options or {}).get("calibration_data")
    if data is None:
        free = f" (free dimensions at length {length})" if has_free_dimensions(original) else ""
        return (sample_inputs(original, check_batch, sequence_length=length),
                f"a random batch of {check_batch}{free}")
    arrays = [a[:check_batch] for a in calibration_inputs(original, data)]
    return (arrays[0] if len(arrays) == 1 else arrays,
            f"the first {len(arrays[0])} calibration examples")


def _keep_unselected_kernels(model, report: RewriteReport, previous: dict):
    """Give the layers that were swapped before the rewrite and are not selected now their kernel
    and backward mode back (`model` has them lowered); note both kinds in the report."""
    entries = {entry.path: entry for entry in report.layers}
    keep = {}
    for path, layer in previous.items():
        entry = entries.get(path)
        if entry is None:
            continue
        if entry.action == "swapped":
            entry.reason = f"re-swapped (was {layer.arithmetic.spec})"
        else:
            entry.reason = f"already swapped: keeps {layer.arithmetic.spec}"
            entry.kernel = layer.arithmetic.spec
            keep[path] = layer

    def restore(path, layer):
        old = keep.get(path)
        if old is None:
            return None
        return type(old).from_config({**layer.get_config(), "arithmetic": old.arithmetic,
                                      "backward": old.backward})

    return transform_model(model, restore)[0] if keep else model
