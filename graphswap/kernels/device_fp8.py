"""The 8-bit floating-point products (graphswap/kernels/fp8.py) as tensor operations XLA compiles.

The FP8 part of the device path (graphswap/kernels/device_products.py has the integer tables and
the reduced-precision floats): `keras.ops` only, so it runs inside `tf.function(jit_compile=True)`,
on any device and under Keras's JAX backend.

* `fp8_encode(t, fmt)`: the FP8 codes of float32 values, bit for bit `kernels.fp8.encode`
  (round to nearest, ties to the even code, saturating at +-max finite, NaN to the format's NaN
  code with the input's sign, -0 to 0x80).  A magnitude m (clipped to max finite) lies in the
  binade 2^e (e = its float32 exponent, at least 1 - bias: the subnormals share the smallest
  normal binade's spacing), where the grid spacing is q = 2^(e - mantissa bits); n = rint(m / q)
  (m / q is exact, rint ties to even) is the significand as an integer, and the code is
  ((e + bias) << mantissa bits) + n - 2^mantissa bits: a carry of n to the next power of two
  lands on the next binade's first code, and n's parity is the code's, so ties to the even n
  are ties to the even code.  `fp8_values(t, fmt)` is decode(encode(t)): sign x n x q.
* `fp8_matmul(a, b, fmt, table, scheme, ...)` / `fp8_conv2d(x, w, fmt, table, scheme,
  geometry, ...)`: Fp8Kernel.matmul / conv2d.  Scales as the kernel computes them (float64:
  amax / max finite, 1 when 0), operands quantized as float32(float64(a) / scale) - the same
  codes as the C path, bit for bit.  table None (the exact built-ins): the decoded operands
  through the backend's float32 matmul / convolution (every product of two FP8 values is exact
  in float32, so only the order of the sums differs from the C path; the decoded values have at
  most 4 significant bits, so they pass TF32 tensor cores and bfloat16 matmul passes unchanged
  too).  A user's table (256 x 256 float32): T[qa, qw] looked up by code pairs and summed in
  float32, in the bounded blocks of device_products.table_sums (never M x K x N); padding taps
  of a convolution hold code 0x00 (+0), as on the C path.  Outputs depending on a non-finite
  input (its row / window, its weight column) are NaN.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from graphswap.errors import ShapeError
from graphswap.kernels import device_products


def _grid(t, fmt):
    """(negative bool, nan bool, n float32, e int32) of float32 `t` on `fmt`'s grid: the value
    is (-1)^negative x n x 2^(e - mantissa bits) (module docstring)."""
    t = ops.convert_to_tensor(t, "float32")
    negative = ops.right_shift(ops.view(t, "uint32"), 31) > 0
    nan = ops.isnan(t)
    magnitude = ops.where(nan, 0.0, ops.minimum(ops.abs(t), fmt.max_finite))
    exponent = ops.right_shift(ops.view(magnitude, "int32"), 23) - 127
    exponent = ops.maximum(exponent, 1 - fmt.bias)
    spacing = ops.view(ops.left_shift(exponent - fmt.mantissa_bits + 127, 23), "float32")
    return negative, nan, ops.round(magnitude / spacing), exponent


def fp8_encode(t, fmt):
    """int32 FP8 codes (0..255) of float32 `t` (kernels.fp8.encode, bit for bit)."""
    negative, nan, n, exponent = _grid(t, fmt)
    m = fmt.mantissa_bits
    code = ops.left_shift(exponent + fmt.bias, m) + ops.cast(n, "int32") - (1 << m)
    code = ops.where(nan, fmt.nan_code, code)
    return code + 128 * ops.cast(negative, "int32")


def fp8_values(t, fmt):
    """float32 values of the FP8 codes of `t` (decode(encode(t)); NaN stays NaN, -0 kept)."""
    negative, nan, n, exponent = _grid(t, fmt)
    spacing = ops.view(ops.left_shift(exponent - fmt.mantissa_bits + 127, 23), "float32")
    value = n * spacing
    value = ops.where(negative, -value, value)
    return ops.where(nan, ops.cast(np.nan, "float32"), value)


def _scale(lo, hi, fmt):
    """float64 scale of a finite range: max(|lo|, |hi|) / max finite, 1 when 0 or empty."""
    scale, _ = device_products.quant_params(lo, hi, True, float(fmt.max_finite))
    return scale


def activation_scale(a, fmt, scheme, activation_range=None):
    """float64 scalar: the activations' scale (the call's finite amax, or the static range:
    the layer's range tensor, else the scheme's)."""
    return _scale(*device_products.activation_bounds(a, scheme, activation_range), fmt)


def weight_scales(w2, fmt, scheme):
    """float64 (N,): the scale of each output column of w2 (K, N) (per_channel) or the
    tensor's, repeated (per_tensor)."""
    n = w2.shape[1]
    if scheme.granularity == "per_channel":
        return _scale(*device_products.finite_range(w2, axis=0), fmt)
    return ops.broadcast_to(_scale(*device_products.finite_range(w2), fmt), (n,))


def _scaled(t, scale):
    """float32(float64(t) / scale): what the C path encodes."""
    return ops.cast(ops.cast(t, "float64") / scale, "float32")


def _table_ext(table) -> np.ndarray:
    """T (65536 float32), then one 0 that padded K taps look up."""
    flat = np.asarray(table, np.float32).reshape(-1)
    if flat.size != 65536:
        raise ShapeError(f"an FP8 multiplier table has 256 x 256 entries, not {flat.size}")
    return np.concatenate([flat, np.zeros(1, np.float32)])


def _dequantized(acc, sa, sb, row_bad, col_bad):
    """float32((sa * sb) * acc), NaN where a row (M, N) or a column (N,) is bad."""
    y = ops.cast((sa * sb)[None, :] * ops.cast(acc, "float64"), "float32")
    bad = ops.logical_or(row_bad, col_bad[None, :])
    return ops.where(bad, ops.cast(np.nan, "float32"), y)


def _columns_bad(w2):
    return ops.logical_not(ops.all(ops.isfinite(w2), axis=0))


def _table_product(a_codes, w_codes, groups: int, table, budget: int):
    """float32 (M, N): sum_k T[a_codes[m, g, k], w_codes[k, j]] over each output channel's
    group (a_codes (M, G, Kg), w_codes (Kg, N), N = G x Ng)."""
    kg, n = (int(d) for d in w_codes.shape)
    per_group = n // groups
    b_index = ops.transpose(ops.reshape(w_codes, (kg, groups, per_group)), (1, 0, 2))
    acc = device_products.table_sums(a_codes * 256, b_index, _table_ext(table), "float32",
                                     budget)
    return ops.reshape(acc, (-1, n))


def fp8_matmul(a, b, fmt, table, scheme, activation_range=None,
               budget: int = device_products.DEFAULT_BUDGET):
    """(m, k) x (k, n) float32 through the FP8 multiplier (Fp8Kernel.matmul): `table` None for
    the exact products, else the 256 x 256 float32 table; `scheme` resolved, `activation_range`
    the layer's static range tensor (or None)."""
    device_products.require_float64()
    a = ops.convert_to_tensor(a, "float32")
    b = ops.convert_to_tensor(b, "float32")
    if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(f"matmul shapes do not agree: {tuple(a.shape)} x {tuple(b.shape)}; "
                         f"expected (m, k) x (k, n)")
    if b.shape[1] == 0:
        return ops.zeros((ops.shape(a)[0], 0), "float32")
    sa = activation_scale(a, fmt, scheme, activation_range)
    sb = weight_scales(b, fmt, scheme)
    if table is None:
        acc = ops.matmul(fp8_values(_scaled(a, sa), fmt), fp8_values(_scaled(b, sb), fmt))
    else:
        acc = _table_product(ops.expand_dims(fp8_encode(_scaled(a, sa), fmt), 1),
                             fp8_encode(_scaled(b, sb), fmt), 1, table, budget)
    row_bad = ops.logical_not(ops.all(ops.isfinite(a), axis=1, keepdims=True))
    return _dequantized(acc, sa, sb, row_bad, _columns_bad(b))


def fp8_conv2d(x, w, fmt, table, scheme, geometry, activation_range=None,
               budget: int = device_products.DEFAULT_BUDGET):
    """NHWC x HWIO float32 convolution through the FP8 multiplier (Fp8Kernel.conv2d);
    `geometry` a ConvGeometry (any batch: the input's is used)."""
    device_products.require_float64()
    x = ops.convert_to_tensor(x, "float32")
    w = ops.convert_to_tensor(w, "float32")
    g = geometry
    if len(x.shape) != 4 or len(w.shape) != 4 or int(x.shape[3]) != g.in_channels:
        raise ShapeError(f"conv2d shapes do not agree: input {tuple(x.shape)}, filter "
                         f"{tuple(w.shape)}; expected NHWC with {g.in_channels} channels and HWIO")
    w2 = ops.reshape(w, (-1, g.out_channels))
    batch = ops.shape(x)[0]
    if g.out_channels == 0:
        return ops.zeros((batch, g.out_height, g.out_width, 0), "float32")
    sx = activation_scale(x, fmt, scheme, activation_range)
    sw = weight_scales(w2, fmt, scheme)
    if table is None:
        vw = ops.reshape(fp8_values(_scaled(w2, sw), fmt), tuple(w.shape))
        acc = device_products.float_conv2d(fp8_values(_scaled(x, sx), fmt), vw, g)
        acc = ops.reshape(acc, (-1, g.out_channels))
    else:
        windows = device_products.conv_windows(fp8_encode(_scaled(x, sx), fmt), g, 0)
        acc = _table_product(windows, fp8_encode(_scaled(w2, sw), fmt), g.groups, table, budget)
    bad = device_products.conv_windows(ops.cast(ops.logical_not(ops.isfinite(x)), "int32"), g, 0)
    window_bad = ops.repeat(ops.max(bad, axis=2) > 0, g.out_channels // g.groups, axis=1)
    y = _dequantized(acc, sx, sw, window_bad, _columns_bad(w2))
    return ops.reshape(y, (batch, g.out_height, g.out_width, g.out_channels))


__all__ = ["activation_scale", "fp8_conv2d", "fp8_encode", "fp8_matmul", "fp8_values",
           "weight_scales"]
