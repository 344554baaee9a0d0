"""`convert`: load a model, rewrite it, check it against the original, save it - the whole
`graphswap convert` command as one API function returning a result the CLI only prints.

It sits in io/ (not swap/) because it reads and writes files; the rewriting itself is
graphswap.swap.rewrite_model.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from graphswap.errors import GraphswapError
from graphswap.io.load import load_model
from graphswap.io.paths import check_output_path, default_output_path, save_model
from graphswap.swap import (OriginalCannotRunError, RewriteReport, max_output_difference,
                            rewrite_model, sample_inputs)


@dataclasses.dataclass
class ConvertResult:
    """What `convert` did: the rewritten model, its report, the check, where it was written."""

    model: object
    report: RewriteReport
    output: Path | None
    check_batch: int
    max_abs_difference: float | None      # None when the check was skipped or not asked for
    note: str | None = None               # why the check was skipped

    def to_dict(self) -> dict:
        payload = self.report.to_dict()
        payload.update({"output": str(self.output) if self.output else None,
                        "max_abs_difference": self.max_abs_difference})
        if self.note:
            payload["note"] = self.note
        return payload

    def format_text(self) -> str:
        lines = [self.report.format_table()]
        if self.max_abs_difference is not None:
            lines.append(f"max |original - rewritten| on a random batch of {self.check_batch}: "
                         f"{self.max_abs_difference:.3g}")
        if self.note:
            lines.append(self.note)
        if self.output is not None:
            lines.append(f"wrote {self.output}")
        return "\n".join(lines)


def convert(model, kernel=None, *, kernel_map=None, include=None, exclude=None,
            layer_types=("Dense", "Conv2D"), backward: str = "native", check_batch: int = 8,
            output=None, force: bool = False, custom_objects=None,
            safe_mode: bool = True, rewrite_options=None) -> ConvertResult:
    """Rewrite `model` (a path, or a keras.Model) so its selected layers run `kernel`.

    `kernel` defaults to "exact", or to none when a `kernel_map` is given (see rewrite_model for
    the selection arguments).  The rewritten model is compared with the original on a random
    batch of `check_batch` (0: skip) and, if `output` is given - or `model` is a path, then
    beside it as MODEL.swapped.keras - saved there atomically (`force` to replace a file).
    Raises GraphswapError when no layer is selected: an unchanged copy is not a conversion.
    `rewrite_options` are rewrite_model's quantization, calibration and folding arguments
    (quantization, calibration_data as arrays, calibration_samples, calibration_method,
    calibration_source, bias_correction, recalibrate_bn, fold_batchnorm).
    """
    source = Path(model) if isinstance(model, (str, os.PathLike)) else None
    if isinstance(check_batch, bool) or not isinstance(check_batch, int) or check_batch < 0:
        raise GraphswapError(f"check_batch must be a whole number >= 0 (0 skips the comparison), "
                             f"got {check_batch!r}")
    if output is None and source is not None:
        output = default_output_path(source, "convert")
    if output is not None:
        output = check_output_path(output, force, inputs=[source])
    if kernel is None and kernel_map is None:
        kernel = "exact"
    original = load_model(source, custom_objects=custom_objects, safe_mode=safe_mode) \
        if source is not None else model
    swapped, report = rewrite_model(original, kernel=kernel, include=include, exclude=exclude,
                                    kernel_map=kernel_map, layer_types=tuple(layer_types),
                                    backward=backward, return_report=True,
                                    **(rewrite_options or {}))
    if not report.swapped:
        shown = source if source is not None else f"model {original.name!r}"
        raise GraphswapError(
            f"nothing to swap in {shown}: no Dense/Conv2D layer was selected "
            f"({len(report.layers)} layers inspected); see 'graphswap inspect MODEL'")
    difference, note = None, None
    if check_batch > 0:
        try:
            difference = max_output_difference(original, swapped,
                                               sample_inputs(original, check_batch))
        except OriginalCannotRunError as exc:
            note = f"comparison with the original skipped: {exc}"
    if output is not None:
        save_model(swapped, output, force=force)
    return ConvertResult(swapped, report, output, check_batch, difference, note)
