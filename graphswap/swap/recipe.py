"""The zero-training recipe rewrite_model applies with calibration data: its defaults (the best
measured, docs/RECOVERY.md: static calibration + DEFAULT_COMPENSATION bias compensation, weight
tuning when DEFAULT_WEIGHT_TUNING, BatchNorm re-estimation for a model that has BatchNormalization
layers when DEFAULT_BN_REESTIMATION) and the report line that names what was applied."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from graphswap.errors import QuantizationError
from graphswap.kernels import QuantScheme
from graphswap.methods import COMPENSATION_REGISTRY
from graphswap.swap.clone import iter_layers
from graphswap.swap.compensation import DEFAULT_COMPENSATION
from graphswap.swap.quantstate import legacy_scheme
from graphswap.swap.weight_tuning import DEFAULT_WEIGHT_TUNING
from graphswap.swap.wiring import DEFAULT_OPERANDS, OPERAND_CHOICES

#: rewrite_model's bias_correction / weight_tuning default: the best measured zero-training
#: recipe whenever calibration data is given (docs/RECOVERY.md), nothing without
DEFAULT_RECIPE = "default"
#: rewrite_model's recalibrate_bn default: re-estimate BatchNorm statistics with calibration data
#: whenever the model has BatchNormalization (the best measured mean, docs/RECOVERY.md)
DEFAULT_BN_REESTIMATION = True


def has_batchnorm(model) -> bool:
    """Whether `model` holds a BatchNormalization layer at any depth."""
    return any(isinstance(layer, keras.layers.BatchNormalization)
               for _, layer in iter_layers(model))


def recipe_defaults(bias_correction, weight_tuning, calibrated: bool, recalibrate_bn=False,
                    batchnorm: bool = False):
    """(bias_correction, weight_tuning, recalibrate_bn) with DEFAULT_RECIPE resolved and checked:
    DEFAULT_COMPENSATION, DEFAULT_WEIGHT_TUNING and (for a model with BatchNormalization layers,
    `batchnorm`) DEFAULT_BN_REESTIMATION with calibration data, None / False without; "none" is
    None."""
    if bias_correction == DEFAULT_RECIPE:
        bias_correction = DEFAULT_COMPENSATION if calibrated else None
    elif bias_correction == "none":
        bias_correction = None
    weight_tuning = _switch("weight_tuning", weight_tuning, DEFAULT_WEIGHT_TUNING and calibrated)
    recalibrate_bn = _switch("recalibrate_bn", recalibrate_bn,
                             DEFAULT_BN_REESTIMATION and calibrated and batchnorm)
    if weight_tuning and not calibrated:
        raise QuantizationError("weight tuning reads each layer's calibrated input distribution: "
                                "pass calibration_data= (--calibrate DATA) as well")
    if recalibrate_bn and not calibrated:
        raise QuantizationError("BatchNorm re-estimation in rewrite_model runs on the calibration "
                                "data: pass calibration_data= (--calibrate DATA) as well")
    if bias_correction is not None:
        COMPENSATION_REGISTRY.check(bias_correction)
        if not calibrated:
            raise QuantizationError("bias compensation is estimated on calibration data: pass "
                                    "calibration_data= (--calibrate DATA) as well")
    return bias_correction, weight_tuning, recalibrate_bn


def _switch(name: str, value, default: bool) -> bool:
    if isinstance(value, str) and value == DEFAULT_RECIPE:
        return bool(default)
    if not isinstance(value, (bool, np.bool_)):
        raise QuantizationError(f"{name} must be True, False or {DEFAULT_RECIPE!r}; got "
                                f"{value!r}")
    return bool(value)


def recipe_note(bias_correction, weight_tuning, recalibrate_bn, fold_batchnorm) -> str:
    """The report line naming the zero-training recipe applied."""
    steps = (["BatchNorm folding"] if fold_batchnorm else []) + ["static calibration"] + \
        (["weight tuning"] if weight_tuning else []) + \
        ([f"{bias_correction} bias compensation"] if bias_correction else []) + \
        (["BatchNorm re-estimation"] if recalibrate_bn else [])
    return (f"zero-training recipe: {' + '.join(steps)} (the default with calibration data: "
            f"static calibration with the layers before each already approximate + measured "
            f"operand wiring{' + weight tuning' if DEFAULT_WEIGHT_TUNING else ''} + "
            f"{DEFAULT_COMPENSATION} bias compensation"
            f"{' + BatchNorm re-estimation where the model has BatchNorm' if DEFAULT_BN_REESTIMATION else ''}"
            f", then the same with weight tuning and the dynamic conversion measured against it; "
            f"bias_correction=None / --bias-correction none, recalibrate_bn=False / "
            f"--no-recalibrate-bn to leave a step out)")


def fallback_wanted(dynamic_fallback, quantization, inplace: bool) -> bool:
    """rewrite_model's `dynamic_fallback` resolved (called with calibration data): the default
    checks against the dynamic conversion except where that cannot be built - a `quantization`
    that asks for static activations itself, a subclassed model swapped in place."""
    explicit_static = isinstance(quantization, (dict, QuantScheme)) and \
        QuantScheme.from_config(quantization).activations == "static"
    if isinstance(dynamic_fallback, str) and dynamic_fallback == DEFAULT_RECIPE:
        return not (explicit_static or inplace)
    wanted = _switch("dynamic_fallback", dynamic_fallback, False)
    if wanted and (explicit_static or inplace):
        raise QuantizationError("dynamic_fallback=True needs a dynamic conversion to compare "
                                "with: not with static activations asked for in quantization= "
                                "nor with inplace=True")
    return wanted


def operands_default(operands, calibrated: bool) -> str | None:
    """rewrite_model's `operands` resolved: DEFAULT_RECIPE -> DEFAULT_OPERANDS with calibration
    data (None without: the scheme's wiring); "auto" needs calibration data."""
    if isinstance(operands, str) and operands == DEFAULT_RECIPE:
        return DEFAULT_OPERANDS if calibrated else None
    if operands is None:     # the scheme's own wiring
        return None
    if operands not in OPERAND_CHOICES:
        raise QuantizationError(f"operands must be one of {', '.join(OPERAND_CHOICES)} or "
                                f"{DEFAULT_RECIPE!r}; got {operands!r}")
    if operands == "auto" and not calibrated:
        raise QuantizationError("operands='auto' measures each layer's wiring on calibration "
                                "data: pass calibration_data= (--calibrate DATA) as well, or a "
                                "fixed wiring (activation_first, weight_first)")
    return operands


QUANTIZATION_PRESETS = ("default", "tfapprox")


@dataclasses.dataclass(frozen=True)
class QuantizationRequest:
    """What rewrite_model was asked for, per kernel: `base` the scheme every multiplier layer
    starts from (None: the legacy default, by the kernel's signedness), static activations when
    `calibrated`, and a fixed operand wiring (None: the scheme's)."""

    base: QuantScheme | None
    calibrated: bool
    operands: str | None = None

    def scheme_for(self, kernel) -> QuantScheme:
        """The QuantScheme a multiplier layer running `kernel` gets."""
        scheme = self.base if self.base is not None else \
            legacy_scheme(bool(getattr(kernel, "signed", 0)))
        if self.calibrated:
            scheme = dataclasses.replace(scheme, activations="static", activation_range=None)
        if self.operands is not None:
            scheme = dataclasses.replace(scheme, operands=self.operands)
        return scheme


def quantization_request(quantization, calibrated: bool,
                         operands: str | None = None) -> QuantizationRequest:
    """The QuantizationRequest rewrite_model gives its multiplier layers.  `quantization`: None
    or "default" (sign-magnitude weights for unsigned multipliers, symmetric for signed,
    per-channel), "tfapprox" (TFApprox: asymmetric per-tensor for unsigned multipliers; signed
    ones keep symmetric per-channel), a dict or a QuantScheme.  Activations are static exactly
    when calibration data is given (dynamic, per call, otherwise).  `operands`: a fixed wiring
    for every layer ("activation_first" / "weight_first"), or None to keep the scheme's."""
    if quantization is None or quantization == "default":
        base = QuantScheme()
    elif isinstance(quantization, str):
        if quantization not in QUANTIZATION_PRESETS:
            raise QuantizationError(f"unknown quantization preset {quantization!r}; allowed: "
                                    f"{', '.join(QUANTIZATION_PRESETS)}, a dict or a QuantScheme")
        base = None
    else:
        base = QuantScheme.from_config(quantization)
    if base is not None and base.activations == "static" and not calibrated \
            and base.activation_range is None:
        raise QuantizationError("static activations need calibration data: pass "
                                "calibration_data= (--calibrate DATA), or use dynamic activations")
    return QuantizationRequest(base, calibrated, operands)
