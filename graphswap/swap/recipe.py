"""The zero-training recipe rewrite_model applies with calibration data: its defaults (the best
measured, docs/RECOVERY.md: static calibration + DEFAULT_COMPENSATION bias compensation, weight
tuning when DEFAULT_WEIGHT_TUNING) and the report line that names what was applied."""

from __future__ import annotations

import numpy as np

from graphswap.errors import QuantizationError
from graphswap.swap.compensation import DEFAULT_COMPENSATION
from graphswap.swap.weight_tuning import DEFAULT_WEIGHT_TUNING

#: rewrite_model's bias_correction / weight_tuning default: the best measured zero-training
#: recipe whenever calibration data is given (docs/RECOVERY.md), nothing without
DEFAULT_RECIPE = "default"


def recipe_defaults(bias_correction, weight_tuning, calibrated: bool):
    """(bias_correction, weight_tuning) with DEFAULT_RECIPE resolved: DEFAULT_COMPENSATION and
    DEFAULT_WEIGHT_TUNING with calibration data, None / False without; "none" is None."""
    if bias_correction == DEFAULT_RECIPE:
        bias_correction = DEFAULT_COMPENSATION if calibrated else None
    elif bias_correction == "none":
        bias_correction = None
    if isinstance(weight_tuning, str) and weight_tuning == DEFAULT_RECIPE:
        weight_tuning = DEFAULT_WEIGHT_TUNING and calibrated
    elif not isinstance(weight_tuning, (bool, np.bool_)):
        raise QuantizationError(f"weight_tuning must be True, False or {DEFAULT_RECIPE!r}; got "
                                f"{weight_tuning!r}")
    if weight_tuning and not calibrated:
        raise QuantizationError("weight tuning reads each layer's calibrated input distribution: "
                                "pass calibration_data= (--calibrate DATA) as well")
    return bias_correction, bool(weight_tuning)


def recipe_note(bias_correction, weight_tuning, recalibrate_bn, fold_batchnorm) -> str:
    """The report line naming the zero-training recipe applied."""
    steps = (["BatchNorm folding"] if fold_batchnorm else []) + ["static calibration"] + \
        (["weight tuning"] if weight_tuning else []) + \
        ([f"{bias_correction} bias compensation"] if bias_correction else []) + \
        (["BatchNorm re-estimation"] if recalibrate_bn else [])
    return (f"zero-training recipe: {' + '.join(steps)} (the default with calibration data: "
            f"static calibration{' + weight tuning' if DEFAULT_WEIGHT_TUNING else ''} + "
            f"{DEFAULT_COMPENSATION} bias compensation; bias_correction=None / "
            f"--bias-correction none to leave compensation out)")
