"""The quantization arithmetic of graphswap/kernels/quantized.py's spec (its module docstring):
float values to 8-bit (or N-bit) codes, scales and zero points, in numpy and as the fused C
kernels' graphswap_lut_quant.  One place, so the numpy pipeline, the exact references and the C
calls compute the same codes."""

from __future__ import annotations

import numpy as np

from graphswap import native
from graphswap.kernels.scheme import QuantScheme, activation_codes_signed

UNSIGNED_LEVELS = 255
SIGNED_LIMIT = 127


def _finite_view(t: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(t as float64 with non-finite values replaced by 0, mask of non-finite values or None)."""
    t64 = np.asarray(t, dtype=np.float64)
    finite = np.isfinite(t64)
    if finite.all():
        return t64, None
    return np.where(finite, t64, 0.0), ~finite


def asymmetric_params(lo, hi, levels: int = UNSIGNED_LEVELS):
    """(scale, zero point) of the asymmetric uint8 range [lo, hi] (arrays broadcast); `levels`:
    the largest code (255, or 2^N - 1 for N-bit weights)."""
    lo = np.minimum(np.asarray(lo, np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, np.float64), 0.0)
    empty = hi == lo
    scale = np.where(empty, 1.0, (hi - lo) / levels)
    zero = np.where(empty, 0, np.clip(np.rint(-lo / scale), 0, levels)).astype(np.int64)
    return scale, zero


def quantize_asymmetric(t: np.ndarray, value_range=None, levels: int = UNSIGNED_LEVELS):
    """uint8 codes, scale, zero point, non-finite mask of one tensor (its own range, or the given
    static (lo, hi)); `levels`: the largest code (255, or 2^N - 1 for N-bit activations)."""
    t64, bad = _finite_view(t)
    if value_range is None:
        lo = float(t64.min()) if t64.size else 0.0
        hi = float(t64.max()) if t64.size else 0.0
    else:
        lo, hi = value_range
    scale, zero = asymmetric_params(lo, hi, levels)
    scale, zero = float(scale), int(zero)
    codes = np.clip(np.rint(t64 / scale) + zero, 0, levels).astype(np.uint8)
    if bad is not None:
        codes[bad] = zero
    return codes, scale, zero, bad


def quantize_symmetric(t: np.ndarray, axis=None, value_range=None, limit: int = SIGNED_LIMIT):
    """int8 codes (as uint8 bit patterns), scales (scalar, or per index of the kept axis), mask;
    `limit`: the largest code (127, or 2^(N-1) - 1 for N-bit activations).

    axis=None: one scale for the tensor (from its own max|t|, or max(|lo|, |hi|) of the static
    value_range); otherwise the scale is per slice along `axis`."""
    t64, bad = _finite_view(t)
    if value_range is not None:
        amax = np.array(max(abs(float(value_range[0])), abs(float(value_range[1]))))
    elif axis is None:
        amax = np.array(float(np.abs(t64).max()) if t64.size else 0.0)
    else:
        axis = axis % t64.ndim
        others = tuple(d for d in range(t64.ndim) if d != axis)
        amax = np.abs(t64).max(axis=others) if t64.size else np.zeros(t64.shape[axis])
    scale = np.where(amax > 0, amax / limit, 1.0)
    shape = [1] * t64.ndim
    if axis is not None and value_range is None:
        shape[axis] = -1
    q = np.clip(np.rint(t64 / scale.reshape(shape)), -limit, limit)
    codes = q.astype(np.int8).view(np.uint8)
    return codes, scale, bad


def activation_quantization(t: np.ndarray, scheme: QuantScheme, signed: bool, bits: int = 8):
    """(codes, scale, zero point, non-finite mask) of activations under `scheme`, at `bits`
    bits (an Nx8 multiplier's N; module docstring)."""
    value_range = scheme.activation_range if scheme.activations == "static" else None
    if activation_codes_signed(signed, scheme):
        codes, scale, bad = quantize_symmetric(t, value_range=value_range,
                                               limit=weight_limit(True, bits))
        return codes, float(scale), 0, bad
    if signed:      # the zero point -128: unsigned codes of [0, hi] (scheme.py)
        value_range = (0.0, value_range[1])
    return quantize_asymmetric(t, value_range, weight_limit(False, bits))


def weight_limit(signed: bool, bits: int = 8) -> int:
    """The largest weight code of `bits`-bit weights: 2^N - 1 unsigned (255 for 8 bits),
    2^(N-1) - 1 signed (127)."""
    return 2 ** (bits - 1) - 1 if signed else 2 ** bits - 1


def quantize_weights(w: np.ndarray, scheme: QuantScheme, bits: int = 8):
    """Weights under a resolved scheme, with the output channel as the last axis, at `bits` bits
    (an 8xN multiplier's N; module docstring).

    Returns (codes uint8 of w's shape - magnitudes for sign_magnitude, negative mask (bool, or None),
    scales float64 (n,), zero points int64 (n,), non-finite mask of w or None)."""
    unsigned_levels = weight_limit(False, bits)
    signed_limit = weight_limit(True, bits)
    t64, bad = _finite_view(w)
    n = t64.shape[-1]
    flat = t64.reshape(-1, n)
    per_channel = scheme.granularity == "per_channel"

    def reduce(values, fn):
        if flat.shape[0] == 0:
            return np.zeros(n)
        return fn(values, axis=0) if per_channel else np.full(n, fn(values))

    if scheme.weights == "asymmetric":
        scale, zero = asymmetric_params(reduce(flat, np.min), reduce(flat, np.max),
                                        unsigned_levels)
        codes = np.clip(np.rint(t64 / scale) + zero, 0, unsigned_levels).astype(np.uint8)
        if bad is not None:
            codes[bad] = np.broadcast_to(zero.astype(np.uint8), codes.shape)[bad]
        return codes, None, scale, zero, bad
    amax = reduce(np.abs(flat), np.max)
    zero = np.zeros(n, np.int64)
    if scheme.weights == "sign_magnitude":
        scale = np.where(amax > 0, amax / unsigned_levels, 1.0)
        codes = np.clip(np.rint(np.abs(t64) / scale), 0, unsigned_levels).astype(np.uint8)
        return codes, t64 < 0, scale, zero, bad
    scale = np.where(amax > 0, amax / signed_limit, 1.0)
    q = np.clip(np.rint(t64 / scale), -signed_limit, signed_limit)
    return q.astype(np.int8).view(np.uint8), None, scale, zero, bad


def fused_quant(scheme: QuantScheme, signed: bool, weight_bits: int = 8,
                activation_bits: int = 8) -> native.LutQuant:
    """The graphswap_lut_quant of a resolved scheme (graphswap_kernels.h), for weights of
    `weight_bits` bits (an 8xN multiplier's N) and activations of `activation_bits` bits (an Nx8
    multiplier's N, in weight_bits' second byte; 8 leaves that byte 0)."""
    quant = native.LutQuant()
    quant.weight_bits = int(weight_bits) | ((int(activation_bits) << 8) if activation_bits != 8
                                            else 0)
    signed_codes = activation_codes_signed(signed, scheme)
    quant.scheme = native.LUT_SIGNED if signed_codes else \
        native.LUT_SIGNED_UNSIGNED_ACTIVATIONS if signed else native.LUT_UNSIGNED
    quant.weight_mode = (native.QUANT_PER_CHANNEL if scheme.granularity == "per_channel"
                         else native.QUANT_PER_TENSOR)
    quant.weight_encoding = (native.WEIGHTS_SIGN_MAGNITUDE if scheme.weights == "sign_magnitude"
                             else native.WEIGHTS_DEFAULT)
    quant.observed_range = None
    if scheme.activations == "static":
        lo, hi = scheme.activation_range
        if signed_codes:
            amax = max(abs(float(lo)), abs(float(hi)))
            scale, zero = (amax / weight_limit(True, activation_bits) if amax > 0 else 1.0), 0
        else:       # a signed circuit's unsigned codes (the zero point -128) take [0, hi]
            scale, zero = asymmetric_params(0.0 if signed else lo, hi,
                                            weight_limit(False, activation_bits))
            scale, zero = float(scale), int(zero)
        quant.activation_mode = native.QUANT_STATIC
        quant.activation_scale = scale
        quant.activation_zero_point = zero
    else:
        quant.activation_mode = native.QUANT_DYNAMIC
        quant.activation_scale = 0.0
        quant.activation_zero_point = 0
    return quant
