"""The entropy (KL) calibrator (graphswap/swap/entropy_calibration.py): its threshold against a
plain per-bin transcription of TensorRT's published algorithm (no numpy grouping tricks), the
ranges it gives signed and unsigned layers, and the method end to end through rewrite_model and
the command line."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import SAMPLE_DATA, SAMPLE_MODEL
from graphswap.cli import main
from graphswap.swap.calibration import quantizing_layers
from graphswap.swap.entropy_calibration import entropy_range, entropy_threshold


def reference_threshold(values, levels, bins):
    """TensorRT's calibration loop, bin by bin (Migacz, GTC 2017, slide 'calibration')."""
    top = float(np.max(values))
    histogram, edges = np.histogram(values, bins=bins, range=(0.0, top))
    best, best_i = math.inf, bins
    for i in range(levels, bins + 1):
        p = [float(h) for h in histogram[:i]]
        p[i - 1] += float(sum(histogram[i:]))
        if sum(p) <= 0:
            continue
        q = [0.0] * i
        group_edges = [int(math.floor(j * i / levels)) for j in range(levels + 1)]
        for j in range(levels):
            start, stop = group_edges[j], max(group_edges[j + 1], group_edges[j] + 1)
            members = [k for k in range(start, stop) if histogram[k] > 0]
            total = float(sum(histogram[start:stop]))
            for k in members:
                q[k] = total / len(members)
        q = [1e-4 if (qk == 0 and pk > 0) else qk for pk, qk in zip(p, [
            q[k] if histogram[k] > 0 else 0.0 for k in range(i)])]
        sp, sq = sum(p), sum(q)
        divergence = sum((pk / sp) * math.log((pk / sp) / (qk / sq))
                         for pk, qk in zip(p, q) if pk > 0)
        if divergence < best:
            best, best_i = divergence, i
    return float(edges[best_i])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_threshold_is_tensorrts_loop(seed):
    rng = np.random.default_rng(seed)
    values = np.abs(np.concatenate([rng.normal(0, 1, 4000), rng.normal(0, 12, 20)]))
    got = entropy_threshold(values, levels=16, bins=128)
    want = reference_threshold(values, levels=16, bins=128)
    assert got == pytest.approx(want, rel=1e-12)
    assert got < values.max()          # the outliers are clipped


def test_ranges_for_signed_and_unsigned_layers():
    rng = np.random.default_rng(3)
    relu = np.maximum(rng.normal(0, 1, 20000), 0)
    relu[:5] = 40.0                    # a few outliers
    lo, hi = entropy_range(relu, float(relu.min()), float(relu.max()), signed=False, limit=255)
    assert lo == 0.0 and 2.0 < hi < 40.0
    signed = rng.normal(0, 1, 20000)
    signed[:5] = -40.0
    lo, hi = entropy_range(signed, float(signed.min()), float(signed.max()), signed=True,
                           limit=127)
    assert lo == -hi and 2.0 < hi < 40.0
    # nothing to clip: a constant zero input keeps an empty range
    assert entropy_threshold(np.zeros(10), 128) == 0.0


def test_entropy_method_end_to_end(tmp_path, digits):
    model = keras.models.load_model(SAMPLE_MODEL)
    x = digits["x_train"][:128]
    entropy = graphswap.rewrite_model(model, kernel="mul8u_drum4", calibration_data=x,
                                      calibration_method="entropy", calibration_source="float",
                                      bias_correction=None, dynamic_fallback=False)
    minmax = graphswap.rewrite_model(model, kernel="mul8u_drum4", calibration_data=x,
                                     calibration_method="minmax", calibration_source="float",
                                     bias_correction=None, dynamic_fallback=False)
    pairs = [(a.current_quantization().activation_range, b.current_quantization().activation_range)
             for (_, a), (_, b) in zip(quantizing_layers(entropy), quantizing_layers(minmax))]
    assert all(0 <= e_hi <= m_hi for (_, e_hi), (_, m_hi) in pairs)
    assert any(e_hi < m_hi for (_, e_hi), (_, m_hi) in pairs)
    result = CliRunner().invoke(main, ["convert", str(SAMPLE_MODEL), "-k", "mul8u_drum4",
                                       "--calibrate", str(SAMPLE_DATA), "--calibration-method",
                                       "entropy", "-o", str(tmp_path / "e.keras")])
    assert result.exit_code == 0, result.output
    assert "(entropy, approximate forward)" in result.output
