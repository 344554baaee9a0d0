"""The table-driven products as tensor operations XLA compiles: the device path.

graphswap's C kernels (`GraphswapForward`, `tf.numpy_function`) run on the host CPU only, and XLA
cannot compile them.  This module computes the same products with `keras.ops` (and nothing else),
so that they run inside `tf.function(jit_compile=True)`, on any device TensorFlow places them on,
and - the same code - under Keras's JAX backend:

* `lut_matmul(a, b, table, signed, scheme, ...)` and `lut_conv2d(x, w, table, signed, scheme,
  geometry, ...)` follow graphswap/kernels/quantized.py's docstring (the exact spec) step by step:
  float64 scale arithmetic, rint half to even (`ops.round`), the clip at +-512 the C quantizers
  apply before rounding, table look-ups of code pairs, exact integer sums, the zero-point
  corrections outside the table, one float64 product and one rounding to float32 - the same
  numbers as the C kernels, bit for bit (tests/test_xla_path.py).
* `float_matmul` / `float_conv2d`: "bf16" (operands rounded to bfloat16, nearest even) and
  "fp32_m{m}" (operand mantissas truncated) - the operands bit for bit those of
  graphswap/kernels/float_kernels.py, then the backend's float32 GEMM / convolution (its
  summation order, so equal to the C kernels within float32 round-off, not bit for bit).

Memory (docs/NATIVE.md, "The device path"): the sums never hold an M x K x N tensor.  The code
pairs are looked up in blocks of `rows` x `chunk` x N (at most `budget` elements, 2^22 by
default: 16 MiB of int32) inside two loops (row blocks, K chunks); the table has one extra entry
0 that padded taps point to, so no block needs a mask (padded rows are cut from the result).  Sign-magnitude weights index a
table [T, -T, 0] (the sign is part of the index).  Sums are int32 when K * max|T| plus the
corrections cannot overflow it (every 8-bit layer of ResNet-50), int64 otherwise.

Convolution: the input's codes are padded with the activation zero point (a real 0, as the C
kernels do), and the window taps are gathered as strided slices (kh x kw of them) into an
(M, groups, taps) code matrix - M x K, the im2col the C kernels build too, never M x K x N.
"""

from __future__ import annotations

import numpy as np
import keras
from keras import ops

from graphswap.errors import QuantizationError, ShapeError
from graphswap.kernels.scheme import activation_codes_signed

#: elements of the largest block of looked-up products (int32: 16 MiB)
DEFAULT_BUDGET = 1 << 22
#: the rows of a block when the number of rows is not known while tracing
UNKNOWN_ROWS_HINT = 128
UNSIGNED_LEVELS = 255.0
SIGNED_LIMIT = 127.0
QUANT_CLIP = 512.0
INT32_LIMIT = 2 ** 31 - 1


# ----------------------------------------------------------------------------------------------
# ranges and quantization (float64, as the spec)
# ----------------------------------------------------------------------------------------------

def require_float64():
    """The quantization arithmetic is float64 (the spec's); JAX without 64-bit types would
    silently compute it in float32, so that is refused."""
    if keras.backend.backend() == "jax":
        import jax

        if not jax.config.jax_enable_x64:
            raise QuantizationError(
                "the device path's quantization arithmetic is float64, which JAX truncates to "
                "float32 unless 64-bit types are on; set JAX_ENABLE_X64=1 (or call "
                "jax.config.update('jax_enable_x64', True)) before using it under Keras's JAX "
                "backend")


def _f64(t):
    return ops.cast(t, "float64")


def finite_range(t, axis=None):
    """(lo, hi) float64 of the finite values of float32 `t` (over `axis`, or all): +inf, -inf
    where there are none - what the C kernels' range scan returns."""
    finite = ops.isfinite(t)
    lo = _reduce(ops.min, ops.where(finite, t, ops.cast(np.inf, t.dtype)), axis, np.inf)
    hi = _reduce(ops.max, ops.where(finite, t, ops.cast(-np.inf, t.dtype)), axis, -np.inf)
    return _f64(lo), _f64(hi)


def _reduce(reduction, t, axis, identity):
    """`reduction` (ops.min / ops.max) of `t` over all (axis None) or axis 0, also of an empty
    tensor (the backends refuse those): one `identity` element / row is appended first."""
    if axis is None:
        return reduction(ops.concatenate([ops.reshape(t, (-1,)),
                                          ops.full((1,), identity, t.dtype)]))
    extra = ops.full((1, *t.shape[1:]), identity, t.dtype)
    return reduction(ops.concatenate([t, extra], axis=0), axis=0)


def quant_params(lo, hi, signed: bool, levels: float | None = None):
    """(scale float64, zero point float64) of a range (gs_qparams_dynamic; broadcasts); `levels`
    the largest code (255 unsigned, 127 signed by default)."""
    if signed:
        levels = SIGNED_LIMIT if levels is None else levels
        amax = ops.where(lo <= hi, ops.maximum(ops.abs(lo), ops.abs(hi)), 0.0)
        scale = ops.where(amax > 0, amax / levels, 1.0)
        return scale, ops.zeros_like(scale)
    levels = UNSIGNED_LEVELS if levels is None else levels
    lo = ops.minimum(lo, 0.0)
    hi = ops.maximum(hi, 0.0)
    empty = hi == lo
    scale = ops.where(empty, 1.0, (hi - lo) / levels)
    zero = ops.where(empty, 0.0, ops.clip(ops.round(-lo / scale), 0.0, levels))
    return scale, zero


def quantize(t, scale, zero, signed: bool, levels: float | None = None):
    """int32 codes 0..255 of float32 `t` (gs_quant_u8 / gs_quant_s8: two's-complement bytes for
    signed), non-finite values as the zero point; `levels` as for quant_params."""
    v = ops.clip(_f64(t) / scale, -QUANT_CLIP, QUANT_CLIP)
    q = ops.round(v)
    if signed:
        levels = SIGNED_LIMIT if levels is None else levels
        q = ops.clip(q, -levels, levels)
        q = ops.where(q < 0, q + 256.0, q)
    else:
        levels = UNSIGNED_LEVELS if levels is None else levels
        q = ops.clip(q + zero, 0.0, levels)
    q = ops.where(ops.isfinite(t), q, zero + ops.zeros_like(q))
    return ops.cast(q, "int32")


def activation_levels(signed: bool, bits: int = 8):
    """The largest activation code for `bits`-bit activations (an Nx8 multiplier's N): None (the
    8-bit defaults) for 8 bits, else 2^(N-1) - 1 signed / 2^N - 1 unsigned."""
    return None if bits == 8 else float(2 ** (bits - 1) - 1 if signed else 2 ** bits - 1)


def activation_bounds(a, scheme, activation_range=None):
    """(lo, hi) float64 of the activations: the batch's finite range (dynamic) or the static
    range (the layer's current range tensor, else the scheme's)."""
    if scheme.activations == "static":
        if activation_range is None:
            if scheme.activation_range is None:
                raise QuantizationError("static activations need a calibrated activation range; "
                                        "calibrate the model first")
            activation_range = np.asarray(scheme.activation_range, np.float32)
        bounds = _f64(ops.convert_to_tensor(activation_range, "float32"))
        return bounds[0], bounds[1]
    return finite_range(a)


def activation_params(a, signed: bool, scheme, activation_range=None, bits: int = 8):
    """(scale, zero) float64 scalars of the activations (activation_bounds), at `bits` bits."""
    lo, hi = activation_bounds(a, scheme, activation_range)
    if signed and not activation_codes_signed(signed, scheme):   # the zero point -128: [0, hi]
        return quant_params(ops.zeros_like(lo), hi, False)
    return quant_params(lo, hi, signed, activation_levels(signed, bits))


def weight_codes(w2, signed: bool, scheme, bits: int = 8):
    """Weights (K, N) float32 under a resolved scheme, at `bits` bits (an 8xN multiplier's N:
    255 becomes 2^N - 1, 127 becomes 2^(N-1) - 1): (codes int32 (K, N) - magnitudes for
    sign_magnitude, negative (bool (K, N)) or None, scale float64 (N,), zero float64 (N,),
    bad column (bool (N,)))."""
    unsigned_levels = float(2 ** bits - 1)
    signed_limit = float(2 ** (bits - 1) - 1)
    per_channel = scheme.granularity == "per_channel"
    axis = 0 if per_channel else None
    bad = ops.logical_not(ops.all(ops.isfinite(w2), axis=0))
    n = w2.shape[1]
    if scheme.weights == "sign_magnitude":
        magnitude = ops.where(ops.isfinite(w2), ops.abs(w2), 0.0)
        amax = _f64(_reduce(ops.max, magnitude, axis, 0.0))
        if not per_channel:
            amax = ops.broadcast_to(amax, (n,))
        scale = ops.where(amax > 0, amax / unsigned_levels, 1.0)
        m = ops.clip(ops.round(_f64(magnitude) / scale), 0.0, unsigned_levels)
        negative = ops.logical_and(ops.isfinite(w2), w2 < 0)
        return ops.cast(m, "int32"), negative, scale, ops.zeros((n,), "float64"), bad
    lo, hi = finite_range(w2, axis=axis)
    if not per_channel:
        lo, hi = ops.broadcast_to(lo, (n,)), ops.broadcast_to(hi, (n,))
    scale, zero = quant_params(lo, hi, signed, signed_limit if signed else unsigned_levels)
    return quantize(w2, scale, zero, signed, signed_limit if signed else unsigned_levels), None, \
        scale, zero, bad


# ----------------------------------------------------------------------------------------------
# the exact integer sums
# ----------------------------------------------------------------------------------------------

def extended_table(table, sign_magnitude: bool) -> np.ndarray:
    """The int32 look-up table: T (65536), then -T for sign-magnitude, then one 0 (padding)."""
    flat = np.asarray(table, np.int64).reshape(-1)
    parts = [flat, -flat] if sign_magnitude else [flat]
    return np.concatenate(parts + [np.zeros(1, np.int64)]).astype(np.int32)


def sum_dtype(table, k: int, unsigned: bool) -> str:
    """int32 when no partial sum can overflow it (K * max|T| plus the zero-point corrections),
    else int64."""
    bound = k * int(np.abs(np.asarray(table, np.int64)).max(initial=0))
    if unsigned:
        bound += 3 * k * 255 * 255
    return "int32" if bound <= INT32_LIMIT else "int64"


def block_shape(rows, groups: int, k: int, n: int, budget: int) -> tuple[int, int]:
    """(row block, K chunk) with row block x groups x chunk x n <= budget (at least 1 x 1)."""
    per_row = max(1, groups * n)
    hint = rows if rows is not None else UNKNOWN_ROWS_HINT
    mb = max(1, min(hint, budget // per_row))
    kc = max(1, min(k, budget // (mb * per_row)))
    return mb, kc


def table_sums(a_index, b_index, table_ext: np.ndarray, acc_dtype: str,
               budget: int = DEFAULT_BUDGET):
    """c[m, g, n] = sum_k table_ext[a_index[m, g, k] + b_index[g, k, n]] for int32 a_index
    (M, G, K) (the code times 256) and b_index (G, K, N), in blocks (module docstring)."""
    groups, k, n = (int(d) for d in b_index.shape)
    rows_static = a_index.shape[0]
    pad_index = int(table_ext.shape[0]) - 1
    table = ops.convert_to_tensor(table_ext)
    mb, kc = block_shape(rows_static, groups, k, n, budget)
    chunks = -(-k // kc)
    if chunks * kc != k:  # padded taps look up the 0 entry
        a_index = ops.pad(a_index, [[0, 0], [0, 0], [0, chunks * kc - k]],
                          constant_values=pad_index)
        b_index = ops.pad(b_index, [[0, 0], [0, chunks * kc - k], [0, 0]])
    b_chunks = ops.transpose(ops.reshape(b_index, (groups, chunks, kc, n)), (1, 0, 2, 3))
    rows = ops.shape(a_index)[0]

    def block_sums(a_block):  # (mb, G, chunks * kc) -> (mb, G, N)
        a_block = ops.reshape(a_block, (mb, groups, chunks, kc))

        def step(c, acc):
            a_c = ops.take(a_block, c, axis=2)                      # (mb, G, kc)
            b_c = ops.take(b_chunks, c, axis=0)                     # (G, kc, N)
            products = ops.take(table, ops.expand_dims(a_c, -1) + ops.expand_dims(b_c, 0))
            # cast back: under JAX with 64-bit types an int32 sum is int64 (numpy's rule)
            return acc + ops.cast(ops.sum(ops.cast(products, acc_dtype), axis=2), acc_dtype)

        start = ops.zeros((mb, groups, n), acc_dtype)
        if chunks == 1:
            return step(0, start)
        return ops.fori_loop(0, chunks, step, start)

    if rows_static is not None and rows_static == mb:
        return block_sums(a_index)
    blocks = (rows + mb - 1) // mb
    a_index = ops.pad(a_index, [[0, blocks * mb - rows], [0, 0], [0, 0]])  # rows cut below
    a_blocks = ops.reshape(a_index, (blocks, mb, groups, chunks * kc))

    def row_step(i, out):
        return ops.slice_update(out, (i * mb, 0, 0),
                                block_sums(ops.take(a_blocks, i, axis=0)))

    out = ops.fori_loop(0, blocks, row_step, ops.zeros((blocks * mb, groups, n), acc_dtype))
    return out[:rows]


# ----------------------------------------------------------------------------------------------
# products
# ----------------------------------------------------------------------------------------------

def _grouped_product(a_codes, a_bad, sa, za, w2, groups: int, table, signed: bool, scheme,
                     budget: int, bits: int = 8):
    """The dequantized product of activation codes (M, G, Kg) with the weights w2 (Kg, N),
    N = G x Ng, output channel j in group j // Ng.  a_bad: bool (M, G) rows/windows holding a
    non-finite value.  Returns float32 (M, N)."""
    kg, n = (int(d) for d in w2.shape)
    if n == 0:   # no output channel: nothing to quantize (the backends refuse empty reductions)
        return ops.zeros((ops.shape(a_codes)[0], 0), "float32")
    per_group = n // groups
    sm = scheme.weights == "sign_magnitude"
    qb, negative, sb, zb, bad_b = weight_codes(w2, signed, scheme, bits)
    b_index = qb + 65536 * ops.cast(negative, "int32") if sm else qb
    b_index = ops.transpose(ops.reshape(b_index, (kg, groups, per_group)), (1, 0, 2))
    table_ext = extended_table(table, sm)
    acc_dtype = sum_dtype(table, kg, not signed)
    acc = table_sums(a_codes * 256, b_index, table_ext, acc_dtype, budget)   # (M, G, Ng)
    acc = ops.reshape(acc, (-1, n))
    za_i = ops.cast(za, acc_dtype)
    if sm:
        signed_m = ops.where(negative, -qb, qb)
        acc = acc - za_i * ops.cast(ops.sum(signed_m, axis=0), acc_dtype)[None, :]
    elif not signed:
        zb_i = ops.cast(zb, acc_dtype)
        row_sums = ops.sum(ops.cast(a_codes, acc_dtype), axis=2)          # (M, G)
        row_sums = ops.repeat(row_sums, per_group, axis=1)                  # (M, N)
        acc = (acc - zb_i[None, :] * row_sums
               - za_i * ops.cast(ops.sum(qb, axis=0), acc_dtype)[None, :]
               + kg * za_i * zb_i[None, :])
    y = ops.cast((sa * sb)[None, :] * ops.cast(acc, "float64"), "float32")
    bad = ops.logical_or(ops.repeat(a_bad, per_group, axis=1), bad_b[None, :])
    return ops.where(bad, ops.cast(np.nan, "float32"), y)


def lut_matmul(a, b, table, signed: bool, scheme, activation_range=None,
               budget: int = DEFAULT_BUDGET, weight_bits: int = 8, activation_bits: int = 8):
    """(m, k) x (k, n) float32 through the 256x256 `table` (LutKernel.matmul, bit for bit);
    `scheme` resolved for the multiplier, `activation_range` the layer's static range tensor."""
    require_float64()
    a = ops.convert_to_tensor(a, "float32")
    b = ops.convert_to_tensor(b, "float32")
    if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(f"matmul shapes do not agree: {tuple(a.shape)} x {tuple(b.shape)}; "
                         f"expected (m, k) x (k, n)")
    sa, za = activation_params(a, signed, scheme, activation_range, activation_bits)
    qa = quantize(a, sa, za, activation_codes_signed(signed, scheme),
                  activation_levels(signed, activation_bits))
    a_bad = ops.logical_not(ops.all(ops.isfinite(a), axis=1, keepdims=True))
    return _grouped_product(ops.expand_dims(qa, 1), a_bad, sa, za, b, 1, table, signed, scheme,
                            budget, weight_bits)


def _window_taps(x, geometry, fill):
    """(B, OH, OW, taps, C) window values of NHWC `x` padded with `fill` (geometry's explicit
    paddings, strides and dilations; taps in (kh, kw) order)."""
    g = geometry
    padded = ops.pad(x, [[0, 0], [g.pad_top, g.pad_bottom], [g.pad_left, g.pad_right], [0, 0]],
                     constant_values=fill)
    taps = []
    for dy in range(g.filter_height):
        for dx in range(g.filter_width):
            top, left = dy * g.dilation_height, dx * g.dilation_width
            taps.append(padded[:, top:top + (g.out_height - 1) * g.stride_height + 1:g.stride_height,
                               left:left + (g.out_width - 1) * g.stride_width + 1:g.stride_width, :])
    return ops.stack(taps, axis=3)


def _grouped_windows(taps, groups: int):
    """(B, OH, OW, taps, C) -> (B * OH * OW, groups, taps * C / groups), K in (kh, kw, c) order
    (the HWIO filter's)."""
    b, oh, ow, t, c = taps.shape
    per = c // groups
    grouped = ops.reshape(taps, (-1, t, groups, per))
    return ops.reshape(ops.transpose(grouped, (0, 2, 1, 3)), (-1, groups, t * per))


def conv_windows(t, geometry, fill):
    """(B * OH * OW, groups, taps * C / groups): the window values of NHWC `t` padded with
    `fill`, K in the HWIO filter's (kh, kw, c) order - the im2col of the C kernels."""
    return _grouped_windows(_window_taps(t, geometry, fill), geometry.groups)


def lut_conv2d(x, w, table, signed: bool, scheme, geometry, activation_range=None,
               budget: int = DEFAULT_BUDGET, weight_bits: int = 8, activation_bits: int = 8):
    """NHWC x HWIO float32 convolution through the table (LutKernel.conv2d, bit for bit);
    `geometry` a ConvGeometry (any batch: the input's is used)."""
    require_float64()
    x = ops.convert_to_tensor(x, "float32")
    w = ops.convert_to_tensor(w, "float32")
    g = geometry
    if len(x.shape) != 4 or len(w.shape) != 4 or int(x.shape[3]) != g.in_channels:
        raise ShapeError(f"conv2d shapes do not agree: input {tuple(x.shape)}, filter "
                         f"{tuple(w.shape)}; expected NHWC with {g.in_channels} channels and HWIO")
    sx, zx = activation_params(x, signed, scheme, activation_range, activation_bits)
    qx = quantize(x, sx, zx, activation_codes_signed(signed, scheme),
                  activation_levels(signed, activation_bits))
    codes = _grouped_windows(_window_taps(qx, g, ops.cast(zx, "int32")), g.groups)
    bad_taps = _window_taps(ops.cast(ops.logical_not(ops.isfinite(x)), "int32"), g, 0)
    x_bad = ops.max(_grouped_windows(bad_taps, g.groups), axis=2) > 0       # (M, G)
    w2 = ops.reshape(w, (-1, g.out_channels))
    y = _grouped_product(codes, x_bad, sx, zx, w2, g.groups, table, signed, scheme, budget,
                         weight_bits)
    batch = ops.shape(x)[0]
    return ops.reshape(y, (batch, g.out_height, g.out_width, g.out_channels))


# ----------------------------------------------------------------------------------------------
# reduced-precision float kernels
# ----------------------------------------------------------------------------------------------

def round_to_bfloat16(t):
    """float32 -> nearest bfloat16 (ties to even) as float32, NaN kept (bit for bit
    graphswap.kernels.float_kernels.round_to_bfloat16)."""
    bits = ops.view(ops.convert_to_tensor(t, "float32"), "uint32")
    rounding = 0x7FFF + ops.bitwise_and(ops.right_shift(bits, 16), 1)
    rounded = ops.bitwise_and(bits + ops.cast(rounding, "uint32"), np.uint32(0xFFFF0000))
    rounded = ops.where(ops.isnan(t), ops.bitwise_or(bits, np.uint32(0x00400000)), rounded)
    return ops.view(ops.cast(rounded, "uint32"), "float32")


def truncate_mantissa(t, mantissa_bits: int):
    """float32 with its mantissa truncated to `mantissa_bits` bits, NaN kept (bit for bit
    graphswap.kernels.float_kernels.truncate_mantissa)."""
    bits = ops.view(ops.convert_to_tensor(t, "float32"), "uint32")
    mask = np.uint32((0xFFFFFFFF << (23 - mantissa_bits)) & 0xFFFFFFFF)
    truncated = ops.where(ops.isnan(t), bits, ops.bitwise_and(bits, mask))
    return ops.view(ops.cast(truncated, "uint32"), "float32")


def operand_rounding(spec: str):
    """The operand rounding of a float kernel spec ("bf16", "fp32_m{m}"), or None."""
    if spec == "bf16":
        return round_to_bfloat16
    if spec.startswith("fp32_m") and spec[6:].isdigit() and 1 <= int(spec[6:]) <= 23:
        bits = int(spec[6:])
        return lambda t: truncate_mantissa(t, bits)
    return None


def float_conv2d(x, w, geometry):
    """The backend's float32 convolution with the geometry's explicit paddings (groups: one
    convolution per group)."""
    g = geometry
    padded = ops.pad(x, [[0, 0], [g.pad_top, g.pad_bottom], [g.pad_left, g.pad_right], [0, 0]])
    strides = (g.stride_height, g.stride_width)
    dilations = (g.dilation_height, g.dilation_width)
    if g.groups == 1:
        return ops.conv(padded, w, strides=strides, padding="valid", dilation_rate=dilations)
    if g.groups == g.in_channels and w.shape[2] == 1 and g.stride_height == g.stride_width:
        # (TensorFlow's depthwise kernel refuses unequal strides: those go group by group)
        depthwise = ops.reshape(w, (g.filter_height, g.filter_width, g.in_channels,
                                    g.out_channels // g.in_channels))
        return ops.depthwise_conv(padded, depthwise, strides=strides, padding="valid",
                                  dilation_rate=dilations)
    xs = ops.split(padded, g.groups, axis=3)
    ws = ops.split(w, g.groups, axis=3)
    return ops.concatenate([ops.conv(xi, wi, strides=strides, padding="valid",
                                     dilation_rate=dilations) for xi, wi in zip(xs, ws)], axis=3)


__all__ = ["DEFAULT_BUDGET", "block_shape", "conv_windows", "extended_table", "finite_range",
           "float_conv2d", "lut_conv2d", "lut_matmul", "operand_rounding", "quant_params",
           "quantize",
           "round_to_bfloat16", "sum_dtype", "table_sums", "truncate_mantissa", "weight_codes"]
