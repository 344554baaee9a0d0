"""Quantized execution of a scalar 8-bit multiplier: float -> 8-bit codes -> table -> exact integer
sums -> float.  LutKernel is the Kernel every multiplier spec resolves to.

Why two schemes: they are what the two families of tools do, and the multiplier's signedness decides
which one a circuit can serve.

Unsigned multipliers (mul8u_*, TFApprox-style asymmetric uint8)
    For a tensor t (the activations / left operand: the whole tensor of this call, i.e. per batch;
    the weights / right operand: the whole tensor):
        lo = min(min(t), 0),  hi = max(max(t), 0)              (the range always contains 0)
        s  = (hi - lo) / 255,  z = clip(rint(-lo / s), 0, 255) (s = 1, z = 0 if hi == lo == 0)
        q  = clip(rint(t / s) + z, 0, 255)                     (the code fed to the multiplier)
    so t ~= s (q - z).  A product of sums is expanded as
        sum_k (qa - za)(qb - zb) = sum_k T[qa, qb] - zb sum_k qa - za sum_k qb + K za zb
    and only the code x code products sum_k T[qa, qb] go through the multiplier table T; the three
    zero-point corrections are computed exactly (integers) outside it, as a TFApprox-style
    accelerator does.  Convolution padding is filled with the input's zero-point code z_x (a real 0),
    and those products do go through the table, as in a zero-point-padded accelerator; the
    correction uses the exact per-window code sums returned by graphswap_lut_conv2d.
Signed multipliers (mul8s_*, AdaPT/TransAxx-style symmetric int8)
    Activations / left operand: one scale per tensor; weights: one scale per output channel (per
    column of the right matrix in matmul, per output channel of the HWIO filter in conv):
        s = max|t| / 127 (s = 1 if max|t| == 0),  q = clip(rint(t / s), -127, 127)
    The code is q's two's-complement byte; zero points are 0, so every product goes through the
    table and no correction is needed; padding is code 0.

Output: y = float32((s_a * s_b) * c), c the exact int64 sum (after the corrections) converted to
float64; all scale arithmetic is float64.  rint rounds half to even.

Non-finite inputs: the range (min/max or max|t|) is taken over the finite values only, non-finite
values are quantized as 0, and every output that depends on a non-finite input (its row of a / its
window of x, or its column of b / its output channel of w) is NaN.  Nothing divides by zero:
all-zero and empty tensors get s = 1.
"""

from __future__ import annotations

import numpy as np

from graphswap import native
from graphswap.errors import ShapeError
from graphswap.kernels.base import Kernel
from graphswap.multipliers import Multiplier
from graphswap.native import ConvGeometry

UNSIGNED_LEVELS = 255
SIGNED_LIMIT = 127


def _finite_view(t: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(t as float64 with non-finite values replaced by 0, mask of non-finite values or None)."""
    t64 = np.asarray(t, dtype=np.float64)
    finite = np.isfinite(t64)
    if finite.all():
        return t64, None
    return np.where(finite, t64, 0.0), ~finite


def quantize_asymmetric(t: np.ndarray) -> tuple[np.ndarray, float, int, np.ndarray | None]:
    """uint8 codes, scale, zero point, non-finite mask (see the module docstring)."""
    t64, bad = _finite_view(t)
    lo = min(float(t64.min()), 0.0) if t64.size else 0.0
    hi = max(float(t64.max()), 0.0) if t64.size else 0.0
    if hi == lo:
        scale, zero = 1.0, 0
    else:
        scale = (hi - lo) / UNSIGNED_LEVELS
        zero = int(np.clip(np.rint(-lo / scale), 0, UNSIGNED_LEVELS))
    codes = np.clip(np.rint(t64 / scale) + zero, 0, UNSIGNED_LEVELS).astype(np.uint8)
    if bad is not None:
        codes[bad] = zero
    return codes, scale, zero, bad


def quantize_symmetric(t: np.ndarray, axis=None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """int8 codes (as uint8 bit patterns), scales (scalar, or per index of the kept axis), mask.

    axis=None: one scale for the tensor; otherwise the scale is per slice along `axis` (the maximum
    is taken over all the other axes)."""
    t64, bad = _finite_view(t)
    if axis is None:
        amax = np.array(float(np.abs(t64).max()) if t64.size else 0.0)
    else:
        axis = axis % t64.ndim
        others = tuple(d for d in range(t64.ndim) if d != axis)
        amax = np.abs(t64).max(axis=others) if t64.size else np.zeros(t64.shape[axis])
    scale = np.where(amax > 0, amax / SIGNED_LIMIT, 1.0)
    shape = [1] * t64.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.rint(t64 / scale.reshape(shape)), -SIGNED_LIMIT, SIGNED_LIMIT)
    codes = q.astype(np.int8).view(np.uint8)
    return codes, scale, bad


class LutKernel(Kernel):
    """Forward arithmetic through a multiplier table, with 8-bit quantization (module docstring)."""

    def __init__(self, multiplier: Multiplier):
        self.multiplier = multiplier
        self.spec = multiplier.spec
        scheme = ("symmetric int8, per-output-channel weight scales" if multiplier.signed
                  else "asymmetric uint8, per-batch activation range")
        self.description = f"{multiplier.description}; {scheme}"
        self._library = native.shipped_library()

    def to_config(self) -> dict:
        return self.multiplier.to_config()

    @property
    def hardware_metrics(self) -> dict:
        return {k: v for k, v in self.multiplier.header_metrics.items() if k.startswith("PDK45")}

    # -- matmul ------------------------------------------------------------------------------
    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.float32)
        b = np.asarray(b, dtype=np.float32)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ShapeError(f"matmul shapes do not agree: {a.shape} x {b.shape}; expected "
                             f"(m, k) x (k, n)")
        k = a.shape[1]
        table = self.multiplier.table
        if self.multiplier.signed:
            qa, sa, bad_a = quantize_symmetric(a)
            qb, sb, bad_b = quantize_symmetric(b, axis=1)
            acc = self._library.lut_matmul(qa, qb, table)
            out = (sa * sb)[None, :] * acc.astype(np.float64)
        else:
            qa, sa, za, bad_a = quantize_asymmetric(a)
            qb, sb, zb, bad_b = quantize_asymmetric(b)
            acc = self._library.lut_matmul(qa, qb, table)
            acc -= zb * qa.sum(axis=1, dtype=np.int64)[:, None]
            acc -= za * qb.sum(axis=0, dtype=np.int64)[None, :]
            acc += k * za * zb
            out = (sa * sb) * acc.astype(np.float64)
        out = out.astype(np.float32)
        if bad_a is not None:
            out[bad_a.any(axis=1), :] = np.nan
        if bad_b is not None:
            out[:, bad_b.any(axis=0)] = np.nan
        return out

    # -- conv --------------------------------------------------------------------------------
    def conv2d(self, x: np.ndarray, w: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        w = np.asarray(w, dtype=np.float32)
        g = geometry
        table = self.multiplier.table
        cout_g = g.out_channels // g.groups
        group_of_channel = np.arange(g.out_channels) // max(cout_g, 1)
        if self.multiplier.signed:
            qx, sx, bad_x = quantize_symmetric(x)
            qw, sw, bad_w = quantize_symmetric(w, axis=3)
            acc, _ = self._library.lut_conv2d(qx, qw, table, 0, g)
            out = (sx * sw)[None, None, None, :] * acc.astype(np.float64)
        else:
            qx, sx, zx, bad_x = quantize_asymmetric(x)
            qw, sw, zw, bad_w = quantize_asymmetric(w)
            acc, window_sums = self._library.lut_conv2d(qx, qw, table, zx, g, window_sums=True)
            taps = g.filter_height * g.filter_width * (g.in_channels // g.groups)
            acc -= zw * window_sums[..., group_of_channel]
            acc -= zx * qw.sum(axis=(0, 1, 2), dtype=np.int64)[None, None, None, :]
            acc += taps * zx * zw
            out = (sx * sw) * acc.astype(np.float64)
        out = out.astype(np.float32)
        if bad_x is not None:
            # windows containing a non-finite input: window sums of the 0/1 mask, per group
            ones = np.ones(w.shape, dtype=np.uint8)
            _, hits = self._library.lut_conv2d(bad_x.astype(np.uint8), ones, table, 0, g,
                                               window_sums=True)
            out[(hits > 0)[..., group_of_channel]] = np.nan
        if bad_w is not None:
            out[..., bad_w.any(axis=(0, 1, 2))] = np.nan
        return out
