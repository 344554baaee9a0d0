"""The zero-step result checked against the plain dynamic conversion: never worse than it.

Static calibration is what hardware runs, and with compensation it usually recovers far more than
the dynamic (per-call range, TFApprox-style) conversion - but not on every model: a recurrent
classifier whose hidden state drifts out of its calibrated range, or a decoder whose outputs are
judged pixel by pixel, can come out worse (docs/RECOVERY.md).  So rewrite_model, given calibration
data, also builds the dynamic conversion and measures both against the original model on examples
of that data, and keeps the calibrated one unless the dynamic one is clearly closer: by more than
MARGIN and by more than twice the check's standard error (`clearly_better`) - never below it
beyond the noise of the check.  The same check decides whether weight tuning, left at its
default, is kept.  Closeness:

    fidelity = mean over the model's outputs of
               top-1 agreement with the original      (an output of rank 2 with >= 2 classes)
               max(0, 1 - MSE / var(original))         (any other output: R^2 against it)

The examples are the calibration data's beyond the first `calibration_samples` (up to
CHECK_SAMPLES; graphswap's commands read that many more), else the calibration examples
themselves.  The report says what both scored and which was kept.
"""

from __future__ import annotations

import numpy as np

from graphswap.swap.calibration import BATCH_SIZE
from graphswap.swap.compare import run_model

#: examples beyond the calibration samples that the check reads (when the data has them)
CHECK_SAMPLES = 512
#: an alternative replaces the calibrated conversion only when it is closer by this much and by
#: more than the check's noise (clearly_better)
MARGIN = 0.005


def _outputs(model, inputs: list[np.ndarray]) -> list[np.ndarray]:
    parts = []
    for start in range(0, len(inputs[0]), BATCH_SIZE):
        batch = [a[start:start + BATCH_SIZE] for a in inputs]
        parts.append(run_model(model, batch[0] if len(batch) == 1 else batch))
    return [np.concatenate(chunks) for chunks in zip(*parts)]


def closeness_parts(reference: list[np.ndarray], outputs: list[np.ndarray]) -> list:
    """Per output: a 0/1 vector of per-example top-1 agreement (an output of rank 2 with >= 2
    classes) or the R^2 against the original (any other output), as a float."""
    parts = []
    for ref, out in zip(reference, outputs):
        ref = np.asarray(ref, np.float64)
        out = np.asarray(out, np.float64)
        if ref.ndim == 2 and ref.shape[1] >= 2:
            parts.append((ref.argmax(axis=1) == out.argmax(axis=1)).astype(np.float64))
        elif not np.isfinite(out).all():
            parts.append(0.0)
        else:
            spread = float(np.var(ref))
            mse = float(np.mean((out - ref) ** 2))
            parts.append(max(0.0, 1.0 - mse / spread) if spread > 0 else float(mse == 0))
    return parts


def _score(parts: list) -> float:
    return float(np.mean([np.mean(p) for p in parts])) if parts else 0.0


def fidelity(reference: list[np.ndarray], outputs: list[np.ndarray]) -> float:
    """How close `outputs` are to the original model's `reference` (module docstring), 0..1."""
    return _score(closeness_parts(reference, outputs))


def clearly_better(candidate: list, current: list, significant: bool = True) -> bool:
    """Whether `candidate`'s closeness beats `current`'s: at all, or (`significant`) by more than
    MARGIN and by more than twice the standard error of the paired difference of the agreements (the
    examples where exactly one of the two agrees with the original): a check of a few hundred
    examples must not trade one recipe for another on noise."""
    gain = _score(candidate) - _score(current)
    if not significant:
        return gain > 0
    errors = [np.sqrt(np.sum(a != b)) / len(a) for a, b in zip(candidate, current)
              if isinstance(a, np.ndarray)]
    noise = 2 * float(np.mean(errors)) / np.sqrt(len(candidate)) if errors else 0.0
    return gain > max(MARGIN, noise)


def check_inputs(data_arrays: list[np.ndarray], samples: int) -> tuple[list[np.ndarray], str]:
    """The examples the check runs on, and how to name them."""
    count = min(len(a) for a in data_arrays)
    if count - samples >= 32:
        end = min(count, samples + CHECK_SAMPLES)
        return ([a[samples:end] for a in data_arrays],
                f"{end - samples} calibration-data examples beyond the {samples} calibrated on")
    used = min(count, samples)
    return [a[:used] for a in data_arrays], f"the {used} calibration examples"


def choose_conversion(original, current, alternatives, data_arrays, samples: int):
    """(model, report layers, notes) of the conversion closest to `original` on the check
    examples: `current` - (model, report layers, notes), rewrite_model's calibrated result - or
    one of `alternatives`, [(name, build)] where build() returns (model, RewriteReport) and name
    says what it is ("calibrated + weight tuning", "dynamic").  An alternative replaces the
    current one only when it is closer by MARGIN; the notes say what each scored and which was
    kept."""
    inputs, where = check_inputs(data_arrays, samples)
    reference = _outputs(original, inputs)
    model, layers, notes = current
    best = closeness_parts(reference, _outputs(model, inputs))
    scores, kept = [f"{_score(best):.2%} calibrated"], "calibrated"
    for name, build in alternatives:
        candidate, report = build()
        closeness = closeness_parts(reference, _outputs(candidate, inputs))
        scores.append(f"{_score(closeness):.2%} {name}")
        # an alternative must win beyond the check's noise: on a model where the calibrated and
        # the dynamic conversions are equally close, the hardware-faithful one stays
        if clearly_better(closeness, best):
            best, kept = closeness, name
            measured = [f"(measured, not kept) {note}" for note in notes
                        if note.startswith(("calibrated", "zero-training", "weight tuning"))]
            model, layers, notes = candidate, report.layers, report.notes + measured
    line = (f"zero-step check on {where}: fidelity to the original (top-1 agreement; R^2 for "
            f"other outputs) {', '.join(scores)}: kept the {kept} conversion")
    if kept == "dynamic":
        line += (" - activations quantized per call, not what fixed-range hardware runs; pass "
                 "dynamic_fallback=False (--no-dynamic-fallback) to keep a calibrated one")
    return model, layers, [*notes, line]
