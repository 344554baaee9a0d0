"""The entropy (KL-divergence) calibrator, as TensorRT's IInt8EntropyCalibrator2 and AdaPT have it
(Migacz, "8-bit Inference with TensorRT", GTC 2017): the clipping threshold whose quantized
distribution loses the least information about the observed one.

Over the magnitudes |v| of a layer's observed inputs, a histogram of BINS bins on [0, max|v|]:
for every candidate threshold at bin i (i = levels .. BINS, levels = the quantizer's number of
non-negative codes: 128 for symmetric int8, 256 for an unsigned uint8 range starting at 0),

    P = the first i bins, the mass of every bin beyond them added to bin i - 1 (clipped values
        land on the largest code);
    Q = P merged into `levels` equal groups of bins, each group's mass spread evenly over its
        non-empty bins (what the quantized values can still tell apart);
    KL(P || Q) over the bins where P > 0 (both normalised; an empty Q bin where P is not gets a
    tiny mass, as TensorRT does, so the divergence stays finite)

and the threshold is the upper edge of bin i with the least KL.  The range is (0, t) for an
unsigned layer whose inputs are >= 0, (-t, t) for a symmetric one, and (max(lo, -t), t) for an
unsigned layer with negative inputs (the asymmetric quantizer keeps its own zero point).
"""

from __future__ import annotations

import numpy as np

BINS = 2048
EPSILON = 1e-4   # the mass an empty quantized bin gets where the reference has mass


def _divergence(p: np.ndarray, q: np.ndarray) -> float:
    p = p / p.sum()
    q = q / q.sum()
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def _quantized(reference: np.ndarray, levels: int) -> np.ndarray:
    """`reference` merged into `levels` groups of bins and spread back over each group's
    non-empty bins (len(reference) >= levels, so every group has a bin)."""
    count = len(reference)
    starts = np.floor(np.linspace(0, count, levels + 1)[:-1]).astype(np.int64)
    filled = reference > 0
    sums = np.add.reduceat(reference, starts)
    nonempty = np.add.reduceat(filled.astype(np.float64), starts)
    per_bin = np.where(nonempty > 0, sums / np.maximum(nonempty, 1.0), 0.0)
    group = np.repeat(np.arange(levels), np.diff(np.append(starts, count)))
    return np.where(filled, per_bin[group], 0.0)


def entropy_threshold(magnitudes: np.ndarray, levels: int, bins: int = BINS) -> float:
    """The clipping threshold of least KL divergence (module docstring) for non-negative
    `magnitudes`; their maximum when there are too few distinct values to clip anything."""
    magnitudes = np.asarray(magnitudes, np.float64)
    top = float(magnitudes.max()) if magnitudes.size else 0.0
    if top <= 0:
        return 0.0
    histogram, edges = np.histogram(magnitudes, bins=bins, range=(0.0, top))
    histogram = histogram.astype(np.float64)
    best, best_bin = np.inf, bins
    for i in range(levels, bins + 1):
        reference = histogram[:i].copy()
        reference[-1] += histogram[i:].sum()
        if reference.sum() <= 0:
            continue
        quantized = _quantized(histogram[:i], levels)
        quantized[(quantized == 0) & (reference > 0)] = EPSILON
        divergence = _divergence(reference, quantized)
        if divergence < best:
            best, best_bin = divergence, i
    return float(edges[best_bin])


def entropy_range(values: np.ndarray, lo: float, hi: float, signed: bool,
                  limit: int) -> tuple[float, float]:
    """(lo, hi) of the entropy calibrator for observed `values` (their extremes lo, hi);
    `limit`: the quantizer's largest code (127 symmetric int8, 255 unsigned uint8)."""
    values = np.asarray(values, np.float64)
    if signed:
        threshold = entropy_threshold(np.abs(values), limit + 1)
        return max(lo, -threshold), min(hi, threshold)
    threshold = entropy_threshold(np.abs(values), limit + 1 if lo >= 0 else (limit + 1) // 2)
    return (0.0 if lo >= 0 else max(lo, -threshold)), min(hi, threshold)
