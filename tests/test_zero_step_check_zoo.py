"""On every model of tests/realmodels.py the default calibrated conversion is never below the
dynamic (uncalibrated) one.  For each model kind (residual CNN with BatchNorm,
depthwise MobileNet, DS-CNN, autoencoder, LSTM/GRU text classifiers, transposed-convolution decoder,
binary and regression MLPs, a custom transformer block) the default conversion with calibration
data and the plain dynamic conversion are both scored here, independently of graphswap's own check
(top-1 agreement with the original for class outputs, R^2 against it otherwise), on the examples
that check reads; the returned model scores at least the dynamic one's, and the report names the
choice."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import graphswap
import realmodels
from graphswap.swap import fallback
from graphswap.swap.calibration import quantizing_layers

CALIBRATED_ON = 64
CHECKED_ON = 96


def closeness(reference, outputs) -> float:
    scores = []
    for ref, out in zip(reference, outputs):
        ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
        if ref.ndim == 2 and ref.shape[1] >= 2:
            scores.append(np.mean(np.argmax(ref, 1) == np.argmax(out, 1)))
        else:
            residual = np.sum((out - ref) ** 2) / max(np.sum((ref - ref.mean()) ** 2), 1e-30)
            scores.append(max(0.0, 1.0 - residual) if np.isfinite(residual) else 0.0)
    return float(np.mean(scores))


def outputs_of(model, x):
    return [np.asarray(o) for o in keras.tree.flatten(model.predict(x, batch_size=128,
                                                                     verbose=0))]


@pytest.mark.parametrize("name", sorted(realmodels.BUILDERS))
def test_the_default_calibrated_conversion_is_never_below_the_dynamic_one(name):
    model = realmodels.trained(keras, name)
    x, _ = realmodels.sample_data(model, n=CALIBRATED_ON + CHECKED_ON, seed=1)
    kernel = "mul8s_drum3"     # a medium signed multiplier every layer type runs
    converted, report = graphswap.rewrite_model(model, kernel=kernel, calibration_data=x,
                                                calibration_samples=CALIBRATED_ON,
                                                return_report=True)
    dynamic = graphswap.rewrite_model(model, kernel=kernel)
    checked = x[CALIBRATED_ON:]
    reference = outputs_of(model, checked)
    kept_score = closeness(reference, outputs_of(converted, checked))
    dynamic_score = closeness(reference, outputs_of(dynamic, checked))
    # never below it beyond the check's noise (graphswap.swap.fallback.clearly_better: the
    # dynamic conversion replaces the calibrated one only when it is closer by more than that)
    assert not fallback.clearly_better(
        fallback.closeness_parts([np.asarray(r) for r in reference],
                                 outputs_of(dynamic, checked)),
        fallback.closeness_parts(reference, outputs_of(converted, checked))), \
        (name, kept_score, dynamic_score)
    assert kept_score >= dynamic_score - 0.1, (name, kept_score, dynamic_score)
    line = report.notes[-1]
    assert line.startswith(f"zero-step check on {CHECKED_ON} calibration-data examples beyond "
                           f"the {CALIBRATED_ON} calibrated on"), line
    kept = line.split("kept the ")[1].split(" conversion")[0]
    static = {layer.current_quantization().activations
              for _, layer in quantizing_layers(converted)}
    assert static == ({"dynamic"} if kept == "dynamic" else {"static"}), (line, static)
