"""Independent references for the multiplier-level work, written from the papers and from
the quantization rules documented in graphswap/quantized.py -- not by calling graphswap's C or
reusing graphswap.quantized's helpers -- so the tests compare two derivations of the same spec.

Built-in multipliers are modelled in plain Python integers (slow but obvious); the quantized
pipeline in numpy with an explicit im2col loop.
"""

from __future__ import annotations

import numpy as np

# ------------------------------------------------------------------------------------------------
# built-in multipliers, one Python function per published design (operands as Python ints)
# ------------------------------------------------------------------------------------------------


def exact(a: int, b: int) -> int:
    return a * b


def truncated(a: int, b: int, k: int) -> int:
    """Exact product with its k least significant bits cleared (two's complement for negatives:
    Python's >> is an arithmetic shift, so this is floor(p / 2^k) * 2^k)."""
    return ((a * b) >> k) << k


def drum_unsigned(a: int, b: int, k: int) -> int:
    """DRUM-k (Hashemi, Bahar, Reda, ICCAD 2015), Fig. 2 of the paper: an operand wider than k bits
    is replaced by the k bits from its leading one, whose last bit is set to 1, shifted back."""

    def approximate(x: int) -> tuple[int, int]:
        if x.bit_length() <= k:
            return x, 0
        shift = x.bit_length() - k
        return (x >> shift) | 1, shift

    ma, sa = approximate(a)
    mb, sb = approximate(b)
    return (ma * mb) << (sa + sb)


def mitchell_unsigned(a: int, b: int) -> float:
    """Mitchell (1962): log2(x) ~= k + f with x = 2^k (1 + f); antilog of the sum, piecewise linear.
    Computed with fractions (exact rationals) to show the result is an integer."""
    from fractions import Fraction

    if a == 0 or b == 0:
        return 0
    ka, kb = a.bit_length() - 1, b.bit_length() - 1
    fa, fb = Fraction(a, 2 ** ka) - 1, Fraction(b, 2 ** kb) - 1
    if fa + fb < 1:
        value = Fraction(2) ** (ka + kb) * (1 + fa + fb)
    else:
        value = Fraction(2) ** (ka + kb + 1) * (fa + fb)
    assert value.denominator == 1
    return int(value)


def sign_magnitude(design):
    def signed(a: int, b: int, *args) -> int:
        magnitude = design(abs(a), abs(b), *args)
        return -magnitude if (a < 0) != (b < 0) else magnitude

    return signed


def builtin_reference(name: str) -> np.ndarray:
    """Table of built-in `name` in graphswap's layout (index (a_code << 8) | b_code)."""
    signed = name.startswith("mul8s_")
    design = name[6:]
    if design == "exact":
        fn, args = exact, ()
    elif design.startswith("trunc"):
        fn, args = truncated, (int(design[5:]),)
    elif design.startswith("drum"):
        fn, args = (sign_magnitude(drum_unsigned) if signed else drum_unsigned), (int(design[4:]),)
    elif design == "mitchell":
        fn, args = (sign_magnitude(mitchell_unsigned) if signed else mitchell_unsigned), ()
    else:
        raise ValueError(name)
    table = np.empty(65536, dtype=np.int64)
    for code_a in range(256):
        a = code_a - 256 if signed and code_a > 127 else code_a
        for code_b in range(256):
            b = code_b - 256 if signed and code_b > 127 else code_b
            table[(code_a << 8) | code_b] = fn(a, b, *args)
    return table


# ------------------------------------------------------------------------------------------------
# quantize -> table -> accumulate -> dequantize, every mode of graphswap/kernels/quantized.py
#
# `mode` is a dict (or None for the defaults) with keys weights ("sign_magnitude" | "asymmetric" |
# "symmetric" | None = sign_magnitude for unsigned, symmetric for signed), granularity
# ("per_channel" | "per_tensor"), activation_range ((lo, hi) for static activations, else None).
# ------------------------------------------------------------------------------------------------


def resolve_mode(mode, signed):
    mode = dict(mode or {})
    weights = mode.get("weights") or ("symmetric" if signed else "sign_magnitude")
    return weights, mode.get("granularity", "per_channel"), mode.get("activation_range")


def _weight_levels(mode, signed):
    """(unsigned levels, signed limit) of the weights: 255 / 127, or for N-bit weights (an 8xN
    multiplier; mode {"weight_bits": N}) 2^N - 1 / 2^(N-1) - 1."""
    bits = int(dict(mode or {}).get("weight_bits", 8))
    return float(2 ** bits - 1), float(2 ** (bits - 1) - 1)


def _finite(values):
    return [float(v) for v in np.asarray(values, np.float64).ravel() if np.isfinite(v)]


def _asym_params_of_range(lo, hi, levels=255.0):
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if lo == hi:
        return 1.0, 0
    scale = (hi - lo) / levels
    return scale, int(min(max(np.rint(-lo / scale), 0), levels))


def _asym_params(t, levels=255.0):
    values = _finite(t)
    return _asym_params_of_range(min(values + [0.0]), max(values + [0.0]), levels)


def _asym_codes(t, scale, zero, levels=255.0):
    t = np.asarray(t, np.float64)
    codes = np.clip(np.rint(np.where(np.isfinite(t), t, 0.0) / scale) + zero, 0, levels)
    return np.where(np.isfinite(t), codes, zero).astype(np.int64)


def _amax_scale(amax, levels):
    return amax / levels if amax > 0 else 1.0


def _sym_scale(t):
    values = [abs(v) for v in _finite(t)]
    return _amax_scale(max(values) if values else 0.0, 127.0)


def _sym_values(t, scale, limit=127.0):
    """Signed quantized values -limit..limit (not codes)."""
    t = np.asarray(t, np.float64)
    return np.clip(np.rint(np.where(np.isfinite(t), t, 0.0) / scale), -limit, limit).astype(
        np.int64)


def _lookup(table, qa, qb, signed):
    """table value for operand values/codes qa (first), qb (second), broadcast."""
    if signed:
        qa, qb = qa % 256, qb % 256  # two's-complement byte
    return np.asarray(table, np.int64)[(qa << 8) | qb]


def _activations(t, signed, static_range, mode=None):
    """(quantized values or codes, scale, zero point); N-bit activations (an Nx8 multiplier;
    mode {"activation_bits": N}) use 2^N - 1 levels / the limit 2^(N-1) - 1."""
    bits = int(dict(mode or {}).get("activation_bits", 8))
    levels, limit = float(2 ** bits - 1), float(2 ** (bits - 1) - 1)
    if signed:
        if static_range is None:
            values = [abs(v) for v in _finite(t)]
            scale = _amax_scale(max(values) if values else 0.0, limit)
        else:
            scale = _amax_scale(max(abs(static_range[0]), abs(static_range[1])), limit)
        return _sym_values(t, scale, limit), scale, 0
    if static_range is None:
        scale, zero = _asym_params(t, levels)
    else:
        scale, zero = _asym_params_of_range(*static_range, levels)
    return _asym_codes(t, scale, zero, levels), scale, zero


def _weight_channel(values, whole, weights, levels=(255.0, 127.0)):
    """One output channel's weights -> (integer operand per weight, sign per weight, scale, zero).

    `whole` is what the scale is computed over (the channel, or the whole tensor); `levels`:
    (unsigned levels, signed limit) of the weights (_weight_levels)."""
    unsigned_levels, signed_limit = levels
    if weights == "asymmetric":
        scale, zero = _asym_params(whole, unsigned_levels)
        return (_asym_codes(values, scale, zero, unsigned_levels),
                np.ones(np.shape(values), np.int64), scale, zero)
    magnitudes = [abs(v) for v in _finite(whole)]
    amax = max(magnitudes) if magnitudes else 0.0
    values = np.asarray(values, np.float64)
    clean = np.where(np.isfinite(values), values, 0.0)
    if weights == "symmetric":
        scale = _amax_scale(amax, signed_limit)
        return _sym_values(values, scale, signed_limit), np.ones(values.shape, np.int64), scale, 0
    scale = _amax_scale(amax, unsigned_levels)
    magnitude = np.clip(np.rint(np.abs(clean) / scale), 0, unsigned_levels).astype(np.int64)
    return magnitude, np.where(clean < 0, -1, 1), scale, 0


def _channel_sum(table, signed, weights, qa, za, qw, sign, zw):
    """Exact integer sum of one output channel over the last axis/axes, by the spec's formulas.
    qa: (..., taps) activation codes/values; qw, sign: (taps,) weight operands."""
    axes = tuple(range(qa.ndim - qw.ndim, qa.ndim))
    products = _lookup(table, qa, np.broadcast_to(qw, qa.shape), signed)
    if weights == "sign_magnitude":
        return (sign * products).sum(axis=axes) - za * int((sign * qw).sum())
    total = products.sum(axis=axes)
    if weights == "asymmetric":
        taps = int(np.prod(qw.shape))
        total = total - zw * qa.sum(axis=axes) - za * int(qw.sum()) + taps * za * zw
    return total


def quantized_matmul(a, b, table, signed, mode=None):
    weights, granularity, static_range = resolve_mode(mode, signed)
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.float64)
    qa, sa, za = _activations(a, signed, static_range, mode)
    for j in range(n):
        whole = b[:, j] if granularity == "per_channel" else b
        qw, sign, sw, zw = _weight_channel(b[:, j], whole, weights, _weight_levels(mode, signed))
        total = _channel_sum(table, signed, weights, qa, za, qw, sign, zw)
        out[:, j] = (sa * sw) * np.asarray(total).astype(np.float64)
    out = out.astype(np.float32)
    out[~np.isfinite(a).all(axis=1), :] = np.nan
    out[:, ~np.isfinite(b).all(axis=0)] = np.nan
    return out


def quantized_conv2d(x, w, table, signed, strides, dilations, pads, groups, mode=None):
    """pads = (top, bottom, left, right); NHWC x, HWIO w."""
    weights, granularity, static_range = resolve_mode(mode, signed)
    x = np.asarray(x, np.float32)
    w = np.asarray(w, np.float32)
    n, h, wd, cin = x.shape
    fh, fw, cin_g, cout = w.shape
    cout_g = cout // groups
    sh, sw = strides
    dh, dw = dilations
    pt, pb, pl, pr = pads
    oh = (h + pt + pb - dh * (fh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (fw - 1) - 1) // sw + 1
    qx, sx, zx = _activations(x, signed, static_range, mode)
    channels = []
    for o in range(cout):
        whole = w[..., o] if granularity == "per_channel" else w
        channels.append(_weight_channel(w[..., o], whole, weights, _weight_levels(mode, signed)))
    padded = np.full((n, h + pt + pb, wd + pl + pr, cin), zx, np.int64)
    padded[:, pt:pt + h, pl:pl + wd, :] = qx
    bad = np.zeros((n, h + pt + pb, wd + pl + pr, cin), bool)
    bad[:, pt:pt + h, pl:pl + wd, :] = ~np.isfinite(x)
    out = np.zeros((n, oh, ow, cout), np.float64)
    nan_mask = np.zeros((n, oh, ow, cout), bool)
    for y in range(oh):
        for xx in range(ow):
            rows = [y * sh + i * dh for i in range(fh)]
            cols = [xx * sw + j * dw for j in range(fw)]
            window = padded[:, rows][:, :, cols]        # (n, fh, fw, cin)
            window_bad = bad[:, rows][:, :, cols]
            for o in range(cout):
                grp = o // cout_g
                patch = window[..., grp * cin_g:(grp + 1) * cin_g]  # (n, fh, fw, cin_g)
                qw, sign, swo, zw = channels[o]
                total = _channel_sum(table, signed, weights, patch, zx, qw, sign, zw)
                out[:, y, xx, o] = (sx * swo) * np.asarray(total).astype(np.float64)
                nan_mask[:, y, xx, o] = window_bad[..., grp * cin_g:(grp + 1) * cin_g].any(
                    axis=(1, 2, 3))
    out = out.astype(np.float32)
    out[nan_mask] = np.nan
    out[..., ~np.isfinite(w).all(axis=(0, 1, 2))] = np.nan
    return out
