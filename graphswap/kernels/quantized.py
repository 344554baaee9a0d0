"""Quantized execution of a scalar 8-bit multiplier: float -> 8-bit codes -> table -> exact integer
sums -> float.  LutKernel is the Kernel every multiplier spec resolves to; the QuantScheme it is
called with (graphswap/kernels/scheme.py) picks the mode.  This docstring is the exact spec
(tests/reference.py re-derives it independently; the tests compare bit for bit).

Notation: a (m, k) activations / left operand, b (k, n) weights / right operand (conv: x the NHWC
input, w the HWIO filter, k = the taps of one window, n = out_channels); T the 256x256 table,
T[qa, qb] the multiplier's product of codes qa (first operand) and qb (second).  All scale
arithmetic is float64; rint rounds half to even; clip(v, lo, hi) = min(max(v, lo), hi).

Activations (one scale for the whole tensor)
  range: "dynamic" - lo = min(finite a), hi = max(finite a) of this call (i.e. of the batch);
         "static"  - (lo, hi) = the scheme's activation_range, the same for every call.
  unsigned multipliers (asymmetric uint8):
      lo' = min(lo, 0), hi' = max(hi, 0)
      s_a = (hi' - lo') / 255, z_a = clip(rint(-lo' / s_a), 0, 255)    (s_a = 1, z_a = 0 if hi' == lo')
      qa  = clip(rint(a / s_a) + z_a, 0, 255)
  signed multipliers (symmetric int8):
      amax = max|finite a| (dynamic) or max(|lo|, |hi|) (static)
      s_a = amax / 127 (1 if amax == 0), z_a = 0, qa = clip(rint(a / s_a), -127, 127)
      (the code fed to the table is qa's two's-complement byte)
  signed multipliers with activation_zero_point -128 (static only; TFLite int8's zero point of
  a non-negative input): s_a = max(hi, 0) / 255 (1 if 0), qa = clip(rint(a / s_a), 0, 255), fed
  to the table as wired below (its rows are these unsigned codes)
Weights: per output channel j (column j of b; last axis of w) with "per_channel"; the same scale
(and zero point) for every j, computed over the whole tensor, with "per_tensor".  Over the values
v of the channel (or tensor), finite ones only:
  "sign_magnitude" (unsigned multipliers; a sign-magnitude MAC):
      s_j = max|v| / 255 (1 if 0), m = clip(rint(|b| / s_j), 0, 255), sigma = -1 if b < 0 else +1
  "asymmetric" (unsigned; TFApprox): lo, hi = min(v), max(v), then s_j, z_j, qb as for activations
  "symmetric" (signed): s_j = max|v| / 127 (1 if 0), qb = clip(rint(b / s_j), -127, 127)
  8xN multipliers (Multiplier.weight_bits = N < 8): the same with 255 replaced by L = 2^N - 1
  (sign-magnitude magnitudes, asymmetric codes and zero points in 0..L) and 127 by 2^(N-1) - 1
  (symmetric); the codes index the table's columns of N-bit weights (multipliers/record.py).
  Nx8 multipliers (Multiplier.activation_bits = N < 8): the activations likewise - 255 becomes
  L = 2^N - 1 (asymmetric codes and zero point in 0..L, for a static range too) and 127 becomes
  2^(N-1) - 1 (symmetric); the codes index the table's rows of N-bit activations.
Exact integer sums c (int64; only code x code products go through the table):
  sign_magnitude:  c_ij = sum_k sigma_kj T[qa_ik, m_kj] - z_a sum_k sigma_kj m_kj
  asymmetric:      c_ij = sum_k T[qa_ik, qb_kj] - z_j sum_k qa_ik - z_a sum_k qb_kj + k z_a z_j
  symmetric:       c_ij = sum_k T[qa_ik, qb_kj]
  The zero-point terms are computed exactly outside the multiplier, as a TFApprox-style accelerator
  does.  Convolution: the sums run over a window's taps; positions in the padding hold the code z_a
  (a real 0), their products do go through the table, and the correction terms count every tap.
Output: y_ij = float32((s_a * s_j) * float64(c_ij)).
Wiring (QuantScheme.operands, .activation_offset, .activation_zero_point): T is the table as
wired (scheme.wired_table): T[qw, qa] for "weight_first", read at qa + o (saturating); with the
zero point -128, row qa is the circuit's row of qa - 128 + o less its row of -128 + o (the
zero-point term: a zero input adds nothing); the sums' codes stay as they are.

Non-finite inputs: ranges are taken over the finite values only, non-finite values are quantized
as a real 0 (code z_a / weight code z_j or magnitude 0), and every output that depends on one (its
row of a / window of x, or its column of b / output channel of w) is NaN.  Nothing divides by
zero: all-zero and empty tensors get s = 1.

Execution: one fused C call per product (graphswap_lut_matmul_f32 / graphswap_lut_conv2d_f32:
quantize -> table GEMM/conv -> exact corrections -> dequantize, per-ISA code chosen at run time),
given the scheme as a graphswap_lut_quant (`fused_quant`; a static range becomes its scale and
zero point, computed here in float64 exactly as above).  Empty operands, and libraries without
the fused entry points, take the numpy pipeline below (same results bit for bit; tested).

How the numpy pipeline computes the sign-magnitude sum with the unsigned table kernel (the spec
above is what counts): the magnitudes are split into a block for the channels' non-negative weights (m where
b >= 0, else 0) and one for the negative weights (m where b < 0, else 0), both multiplied in one
call (2n columns); their difference is sum_k sigma T[qa, m] - sum_k sigma T[qa, 0], and the second
term - zero for every multiplier with T[a, 0] == 0 - is added back exactly with a 0/1 indicator
table when the table has a nonzero T[a, 0].
"""

from __future__ import annotations

import dataclasses

import numpy as np

from graphswap import native
from graphswap.errors import QuantizationError
from graphswap.kernels.base import Kernel, matmul_operands
# the spec's arithmetic (graphswap.kernels.codes), importable from here as well
from graphswap.kernels.codes import (SIGNED_LIMIT, UNSIGNED_LEVELS, activation_quantization,  # noqa: F401
                                     asymmetric_params, fused_quant, quantize_asymmetric,
                                     quantize_symmetric, quantize_weights, weight_limit)
from graphswap.kernels.scheme import QuantScheme, tfapprox_scheme, wired_table
from graphswap.multipliers import Multiplier, builtin
from graphswap.native import ConvGeometry

__all__ = ["LutKernel", "QuantScheme", "SIGNED_LIMIT", "UNSIGNED_LEVELS",
           "activation_quantization", "quantize_asymmetric", "quantize_symmetric",
           "quantize_weights", "tfapprox_scheme"]


def _split_signs(magnitudes: np.ndarray, negative: np.ndarray, groups: int = 1):
    """(..., n) magnitudes -> (..., 2n) blocks [non-negative | negative] per group, so that output
    channel groups stay contiguous for the conv kernel."""
    positive_block = np.where(negative, 0, magnitudes).astype(np.uint8)
    negative_block = np.where(negative, magnitudes, 0).astype(np.uint8)
    lead = magnitudes.shape[:-1]
    n = magnitudes.shape[-1]
    per = n // groups
    stacked = np.stack([positive_block.reshape(*lead, groups, per),
                        negative_block.reshape(*lead, groups, per)], axis=-2)
    return np.ascontiguousarray(stacked.reshape(*lead, 2 * n))


def _join_signs(acc: np.ndarray, groups: int = 1) -> np.ndarray:
    """(..., 2n) block sums -> (..., n): non-negative block minus negative block."""
    lead = acc.shape[:-1]
    per = acc.shape[-1] // (2 * groups)
    parts = acc.reshape(*lead, groups, 2, per)
    return (parts[..., 0, :] - parts[..., 1, :]).reshape(*lead, groups * per)


class LutKernel(Kernel):
    """Forward arithmetic through a multiplier table, with 8-bit quantization (module docstring)."""

    quantizes = True

    #: this kernel's table's wiring (QuantScheme.operands / .activation_offset)
    operands = "activation_first"
    activation_offset = 0
    activation_zero_point = 0
    #: the exact products compensation measures against: the codes as they are, never offset
    reference_products = False

    def __init__(self, multiplier: Multiplier):
        self.multiplier = multiplier
        self._orientations = {(self.operands, 0, 0): self}
        self.spec = multiplier.spec
        self.signed = bool(multiplier.signed)
        self.weight_bits = int(getattr(multiplier, "weight_bits", 8))
        self.activation_bits = int(getattr(multiplier, "activation_bits", 8))
        default = QuantScheme().resolve(self.signed)
        self.description = (f"{multiplier.description}; "
                            f"{default.describe(self.weight_bits, self.activation_bits)} by "
                            f"default")
        self._library = native.shipped_library()
        self._fused = self._library.has_fused_lut
        self._table32 = np.ascontiguousarray(np.asarray(multiplier.table, dtype=np.int32)
                                             .reshape(-1))
        table = np.asarray(multiplier.table, dtype=np.int64).reshape(256, 256)
        # sign-magnitude: T[a, 0] per activation code, needed only when some entry is nonzero
        zero_column = table[:, 0]
        self._zero_column_table = None
        if not self.signed and zero_column.any():
            indicator = np.zeros((256, 256), np.int64)
            indicator[:, 1] = zero_column
            self._zero_column_table = indicator.reshape(-1).astype(np.int32)

    def to_config(self) -> dict:
        return self.multiplier.to_config()

    @property
    def fused_table(self) -> np.ndarray | None:
        """The int32 table (65536 entries) the fused C kernels read, or None when the library
        has no fused kernels."""
        return self._table32 if self._fused else None

    @property
    def hardware_metrics(self) -> dict:
        return {k: v for k, v in self.multiplier.header_metrics.items() if k.startswith("PDK45")}

    def exact_products(self) -> "LutKernel":
        """The exact multiplier of the same signedness: the same codes, exact products (what bias
        compensation measures the approximate products against)."""
        exact = builtin("mul8s_exact" if self.signed else "mul8u_exact")
        if self.weight_bits != 8 or self.activation_bits != 8:
            # the same N-bit codes (the table is exact everywhere)
            exact = dataclasses.replace(exact, weight_bits=self.weight_bits,
                                        activation_bits=self.activation_bits,
                                        spec=f"{exact.spec}:{self.activation_bits}x"
                                             f"{self.weight_bits}")
        exact = LutKernel(exact)
        exact.reference_products = True
        return exact

    def wired(self, quant: QuantScheme | None) -> "LutKernel":
        """The kernel whose table is wired as `quant` says (this one, or an oriented one); the
        exact reference products move only by the zero point (they stay q * w)."""
        if quant is None:
            return self
        if self.reference_products:
            return self.oriented("activation_first", 0, quant.activation_zero_point)
        return self.oriented(quant.operands, quant.activation_offset, quant.activation_zero_point)

    def oriented(self, operands: str, activation_offset: int = 0,
                 activation_zero_point: int = 0) -> "LutKernel":
        """This multiplier with the weight code on its first operand ("weight_first": T'[qa, qw]
        = T[qw, qa]) or its second ("activation_first"), each activation code moved by
        `activation_offset` (saturating: T'[qa, qw] = T[clip(qa + o), qw]), with the zero point
        -128 read as unsigned codes (scheme.wired_table); the same record, so a layer saves the
        file it names and its scheme the wiring.  Cached per kernel."""
        key = (operands, int(activation_offset), int(activation_zero_point))
        kernel = self._orientations.get(key)
        if kernel is None:
            if operands == "weight_first" and (self.weight_bits, self.activation_bits) != (8, 8):
                raise QuantizationError(
                    f"{self.spec}: a {self.multiplier.width} multiplier has one narrow port, "
                    f"wired to its {'weight' if self.weight_bits != 8 else 'activation'}; only "
                    f"8x8 multipliers take operands='weight_first'")
            if key[1] and self.activation_bits != 8:
                raise QuantizationError(f"{self.spec}: an activation_offset applies to 8-bit "
                                        f"activation codes, not {self.activation_bits}-bit ones")
            base = self.base.multiplier
            if key[2] and (not self.signed or self.activation_bits != 8):
                raise QuantizationError(f"{self.spec}: the activation zero point -128 is for "
                                        f"signed multipliers with 8-bit activations")
            table = wired_table(base.table, operands, key[1], self.signed, key[2])
            wiring = " (weights on its first operand)" if operands == "weight_first" else ""
            wiring += f" (activation codes {key[1]:+d})" if key[1] else ""
            wiring += f" (activation zero point {key[2]})" if key[2] else ""
            kernel = LutKernel(dataclasses.replace(
                base, table=np.ascontiguousarray(table.reshape(-1), dtype=np.int32),
                description=f"{base.description}{wiring}"))
            kernel.operands, kernel.activation_offset, kernel.activation_zero_point = key
            kernel.reference_products = self.reference_products
            kernel._orientations = self._orientations
            self._orientations[key] = kernel
        return kernel

    @property
    def base(self) -> "LutKernel":
        """The kernel of the circuit's own table (activations first, no offset)."""
        return self._orientations[("activation_first", 0, 0)]

    def resolve_scheme(self, quant: QuantScheme | None) -> QuantScheme:
        """The scheme this kernel runs for `quant` (None: the default, dynamic activations)."""
        scheme = (quant if quant is not None else QuantScheme()).resolve(self.signed)
        if not scheme.calibrated:
            raise QuantizationError(
                f"{self.spec}: static activations need a calibrated activation range; calibrate "
                f"the model (rewrite_model(..., calibration_data=...), --calibrate DATA)")
        return scheme

    # -- matmul ------------------------------------------------------------------------------
    def matmul(self, a: np.ndarray, b: np.ndarray, quant: QuantScheme | None = None) -> np.ndarray:
        if (wired := self.wired(quant)) is not self:
            return wired.matmul(a, b, quant)
        a, b = matmul_operands(a, b)
        scheme = self.resolve_scheme(quant)
        if self._fused and a.size and b.size:
            return self._library.lut_matmul_f32(a, b, self._table32,
                                                fused_quant(scheme, self.signed, self.weight_bits,
                                                            self.activation_bits))
        k = a.shape[1]
        table = self.multiplier.table
        qa, sa, za, bad_a = activation_quantization(a, scheme, self.signed, self.activation_bits)
        qb, negative, sb, zb, bad_b = quantize_weights(b, scheme, self.weight_bits)
        if scheme.weights == "sign_magnitude":
            acc = _join_signs(self._library.lut_matmul(qa, _split_signs(qb, negative), table))
            if self._zero_column_table is not None:
                indicator = _split_signs(np.ones_like(qb), negative)
                acc += _join_signs(self._library.lut_matmul(qa, indicator,
                                                            self._zero_column_table))
            signed_magnitudes = np.where(negative, -qb.astype(np.int64), qb.astype(np.int64))
            acc -= za * signed_magnitudes.sum(axis=0)[None, :]
        else:
            acc = self._library.lut_matmul(qa, qb, table)
            if scheme.weights == "asymmetric":
                acc -= zb[None, :] * qa.sum(axis=1, dtype=np.int64)[:, None]
                acc -= za * qb.sum(axis=0, dtype=np.int64)[None, :]
                acc += k * za * zb[None, :]
        out = ((sa * sb)[None, :] * acc.astype(np.float64)).astype(np.float32)
        if bad_a is not None:
            out[bad_a.any(axis=1), :] = np.nan
        if bad_b is not None:
            out[:, bad_b.any(axis=0)] = np.nan
        return out

    # -- conv --------------------------------------------------------------------------------
    def conv2d(self, x: np.ndarray, w: np.ndarray, geometry: ConvGeometry,
               quant: QuantScheme | None = None) -> np.ndarray:
        if (wired := self.wired(quant)) is not self:
            return wired.conv2d(x, w, geometry, quant)
        x = np.asarray(x, dtype=np.float32)
        w = np.asarray(w, dtype=np.float32)
        g = geometry
        scheme = self.resolve_scheme(quant)
        if self._fused and x.size and w.size:
            return self._library.lut_conv2d_f32(x, w, self._table32,
                                                fused_quant(scheme, self.signed, self.weight_bits,
                                                            self.activation_bits), g)
        table = self.multiplier.table
        cout_g = g.out_channels // g.groups
        group_of_channel = np.arange(g.out_channels) // max(cout_g, 1)
        qx, sx, zx, bad_x = activation_quantization(x, scheme, self.signed, self.activation_bits)
        qw, negative, sw, zw, bad_w = quantize_weights(w, scheme, self.weight_bits)
        if scheme.weights == "sign_magnitude":
            acc2, _ = self._library.lut_conv2d(qx, _split_signs(qw, negative, g.groups), table, zx,
                                               _doubled(g))
            acc = _join_signs(acc2, g.groups)
            if self._zero_column_table is not None:
                indicator = _split_signs(np.ones_like(qw), negative, g.groups)
                extra, _ = self._library.lut_conv2d(qx, indicator, self._zero_column_table, zx,
                                                    _doubled(g))
                acc += _join_signs(extra, g.groups)
            signed_magnitudes = np.where(negative, -qw.astype(np.int64), qw.astype(np.int64))
            acc -= zx * signed_magnitudes.sum(axis=(0, 1, 2))[None, None, None, :]
        elif scheme.weights == "asymmetric":
            acc, window_sums = self._library.lut_conv2d(qx, qw, table, zx, g, window_sums=True)
            taps = g.filter_height * g.filter_width * (g.in_channels // g.groups)
            acc -= zw * window_sums[..., group_of_channel]
            acc -= zx * qw.sum(axis=(0, 1, 2), dtype=np.int64)[None, None, None, :]
            acc += taps * zx * zw
        else:
            acc, _ = self._library.lut_conv2d(qx, qw, table, 0, g)
        out = ((sx * sw) * acc.astype(np.float64)).astype(np.float32)
        if bad_x is not None:
            # windows containing a non-finite input: window sums of the 0/1 mask, per group
            ones = np.ones(w.shape, dtype=np.uint8)
            _, hits = self._library.lut_conv2d(bad_x.astype(np.uint8), ones, table, 0, g,
                                               window_sums=True)
            out[(hits > 0)[..., group_of_channel]] = np.nan
        if bad_w is not None:
            out[..., bad_w.any(axis=(0, 1, 2))] = np.nan
        return out


def _doubled(g: ConvGeometry) -> ConvGeometry:
    """The geometry with twice the output channels (the sign-magnitude blocks)."""
    return dataclasses.replace(g, out_channels=2 * g.out_channels)
