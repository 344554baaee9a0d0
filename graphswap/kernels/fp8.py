"""8-bit floating-point multipliers: E4M3 / E5M2 quantization and the FP8 kernels.

Formats (OCP 8-bit floating point, "OFP8"; ml_dtypes' float8_e4m3fn / float8_e5m2, which
TensorFlow ships, hold the same codes):

    format  bias  max finite  specials                                   code layout
    E4M3    7     448         NaN = S.1111.111 (0x7F, 0xFF); no infinity  S EEEE MMM
    E5M2    15    57344       inf = S.11111.00, NaN = S.11111.{01,10,11}  S EEEEE MM
    (E = 0: subnormal, value (M / 2^m) * 2^(1 - bias); else (1 + M / 2^m) * 2^(E - bias))

Quantization (`encode`): round to nearest, ties to the even code, *saturating*: a magnitude
beyond the largest finite value (infinity included) becomes +-max finite (OCP's saturating
conversion, what FP8 accelerators use for activations and weights); NaN stays NaN (0x7F with the
input's sign for E4M3, 0x7E for E5M2, as ml_dtypes writes it); -0 keeps its sign (code 0x80).
For every float32 x: encode(x) == ml_dtypes' cast of clip(x, -max, max) (tests/test_fp8.py).

The kernels (`Fp8Kernel`): a (m, k) x (k, n) product (conv2d: the same over each window's taps)

    activations  one scale per tensor: amax = max|finite a| of the call ("dynamic") or
                 max(|lo|, |hi|) of the calibrated static range ("static");
                 s_a = amax / max_finite (1 if amax == 0); qa = encode(float32(a / s_a))
    weights      "symmetric" only (FP8 has a sign bit): s_j = max|finite b[:, j]| / max_finite
                 per output channel ("per_channel") or over the whole tensor ("per_tensor")
                 (1 if 0); qb = encode(float32(b / s_j))
    products     P[i, j] = sum over k of T[qa_ik, qb_kj], a float32 running sum
    output       y_ij = float32((s_a * s_j) * P[i, j])   (scale arithmetic in float64)

    T is the multiplier: for the built-ins fp8_e4m3 / fp8_e5m2 the exact product
    decode(qa) * decode(qb).  That product is exact in float32 (E4M3 significands have 4 bits,
    their product 8; E5M2's 3 and 6; the exponents stay far inside float32's range), so the exact
    kernels decode both operands to float32 and run graphswap's float32 GEMM / conv2d: the same
    products, the sums in OpenBLAS' order.  A user's multiplier (graphswap/multipliers/
    fp8_circuits.py: a C function of two codes returning float, or a .npy float32 table) runs
    through the float-table GEMM (graphswap_lut_float_matmul, native_kernels/src/lut_float.c: the
    sums in increasing k), convolutions as patches x that GEMM (padding taps hold +0, code 0x00).
    Every output that depends on a non-finite input (its row of a / window of x, its column of b
    / output channel of w) is NaN; scales are taken over finite values only.

Spec strings: "fp8_e4m3", "fp8_e5m2" (exact); "fp8_e4m3:PATH.c[:FUNCTION]",
"fp8_e5m2:PATH.npy" (a user's multiplier whose operand codes are in that format).

Gradients: "native" (TensorFlow's MatMul/Conv2D gradients, straight-through) and "kernel" work as
for every kernel; "lut_grad" (derivatives of an integer table over its codes) is refused when the layer is made
(UnsupportedLayerError naming the layer): FP8 codes are not evenly spaced values, and a finite
difference over neighbouring codes would mix exponent steps.
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from graphswap import native
from graphswap.errors import KernelSpecError, QuantizationError
from graphswap.kernels.base import Kernel, matmul_operands
from graphswap.kernels.scheme import QuantScheme
from graphswap.multipliers import fp8_circuits


@dataclasses.dataclass(frozen=True)
class Fp8Format:
    """One OCP FP8 format."""

    name: str            # "e4m3" / "e5m2"
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_finite: float
    max_code: int        # the largest finite positive code
    nan_code: int        # the NaN code graphswap writes (positive sign)
    has_inf: bool

    @property
    def values(self) -> np.ndarray:
        """float32[256]: the value of every code (NaN codes NaN, E5M2's inf codes +-inf)."""
        return _value_table(self)

    @property
    def finite_codes(self) -> np.ndarray:
        """bool[256]: which codes are finite values."""
        return np.isfinite(self.values)


E4M3 = Fp8Format("e4m3", 4, 3, 7, 448.0, 0x7E, 0x7F, False)
E5M2 = Fp8Format("e5m2", 5, 2, 15, 57344.0, 0x7B, 0x7E, True)
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}

_values: dict[str, np.ndarray] = {}


def _value_table(fmt: Fp8Format) -> np.ndarray:
    table = _values.get(fmt.name)
    if table is None:
        m = fmt.mantissa_bits
        codes = np.arange(256)
        sign = np.where(codes & 0x80, -1.0, 1.0)
        exponent = (codes >> m) & ((1 << fmt.exponent_bits) - 1)
        mantissa = codes & ((1 << m) - 1)
        normal = (1.0 + mantissa / (1 << m)) * np.exp2(exponent - fmt.bias)
        subnormal = (mantissa / (1 << m)) * 2.0 ** (1 - fmt.bias)
        magnitude = np.where(exponent == 0, subnormal, normal)
        top = (1 << fmt.exponent_bits) - 1
        if fmt.has_inf:   # E5M2: the top exponent holds inf (M = 0) and NaN
            magnitude = np.where((exponent == top) & (mantissa == 0), np.inf, magnitude)
            magnitude = np.where((exponent == top) & (mantissa != 0), np.nan, magnitude)
        else:             # E4M3: only S.1111.111 is NaN
            magnitude = np.where((codes & 0x7F) == 0x7F, np.nan, magnitude)
        table = (sign * magnitude).astype(np.float32)
        table.setflags(write=False)
        _values[fmt.name] = table
    return table


def encode(values, fmt: Fp8Format) -> np.ndarray:
    """uint8 FP8 codes of float32 `values`: round to nearest even, saturating (module
    docstring)."""
    x = np.asarray(values, dtype=np.float32)
    bits = x.view(np.uint32)
    negative = (bits >> np.uint32(31)).astype(np.uint8)
    with np.errstate(invalid="ignore"):
        magnitude = np.minimum(np.abs(x.astype(np.float64)), fmt.max_finite)  # NaN stays NaN
    grid = fmt.values[:fmt.max_code + 1].astype(np.float64)   # increasing, grid[c] = code c
    nan = np.isnan(magnitude)
    magnitude = np.where(nan, 0.0, magnitude)
    above = np.searchsorted(grid, magnitude, side="left")     # grid[above] >= magnitude
    above = np.minimum(above, fmt.max_code)
    below = np.maximum(above - 1, 0)
    # nearest by comparing 2x with the neighbours' sum (exact in float64); ties -> even code
    twice, middle = 2.0 * magnitude, grid[below] + grid[above]
    code = np.where(grid[above] == magnitude, above,
                    np.where(twice < middle, below,
                             np.where(twice > middle, above,
                                      np.where(below % 2 == 0, below, above))))
    code = np.where(nan, fmt.nan_code, code).astype(np.uint8)
    return code | (negative << np.uint8(7))


def decode(codes, fmt: Fp8Format) -> np.ndarray:
    """float32 values of uint8 FP8 codes."""
    return fmt.values[np.asarray(codes, dtype=np.uint8)]


def _scale(amax, fmt: Fp8Format):
    amax = np.asarray(amax, dtype=np.float64)
    return np.where(amax > 0, amax / fmt.max_finite, 1.0)


def _finite_abs(t: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    t64 = np.abs(np.asarray(t, dtype=np.float64))
    finite = np.isfinite(t64)
    if finite.all():
        return t64, None
    return np.where(finite, t64, 0.0), ~finite


def quantize_activations(a: np.ndarray, scheme: QuantScheme, fmt: Fp8Format):
    """(codes, scale, non-finite mask or None) of an activation tensor (one scale)."""
    magnitudes, bad = _finite_abs(a)
    if scheme.activations == "static":
        lo, hi = scheme.activation_range
        amax = max(abs(lo), abs(hi))
    else:
        amax = float(magnitudes.max()) if magnitudes.size else 0.0
    scale = float(_scale(amax, fmt))
    codes = encode((np.asarray(a, np.float64) / scale).astype(np.float32), fmt)
    return codes, scale, bad


def quantize_weights(w: np.ndarray, scheme: QuantScheme, fmt: Fp8Format):
    """(codes, scales per output channel (last axis), non-finite mask or None)."""
    magnitudes, bad = _finite_abs(w)
    channels = w.shape[-1]
    if scheme.granularity == "per_tensor":
        amax = np.full(channels, magnitudes.max() if magnitudes.size else 0.0)
    else:
        flat = magnitudes.reshape(-1, channels)
        amax = flat.max(axis=0) if flat.shape[0] else np.zeros(channels)
    scales = _scale(amax, fmt)
    codes = encode((np.asarray(w, np.float64) / scales).astype(np.float32), fmt)
    return codes, scales, bad


_FP8_SPEC = re.compile(r"^fp8_(?P<format>e4m3|e5m2)(?::(?P<file>.+))?$")
_C_FILE = re.compile(r"^(?P<path>.+?\.c)(?::(?P<function>[A-Za-z_]\w*))?$")


@dataclasses.dataclass(frozen=True)
class Fp8Spec:
    """A parsed FP8 spec: the format, and the file of a user's multiplier (None: exact)."""

    format: Fp8Format
    kind: str | None = None        # "c" / "npy" / None
    path: str | None = None
    function: str | None = None

    @property
    def what(self) -> str:
        return "FP8 multiplier source" if self.kind == "c" else "FP8 multiplier table"

    @property
    def executable(self) -> bool:
        return self.kind == "c"

    def at(self, path: str) -> "Fp8Spec":
        return dataclasses.replace(self, path=path)

    @property
    def spec(self) -> str:
        if self.kind is None:
            return f"fp8_{self.format.name}"
        return (f"fp8_{self.format.name}:{self.path}"
                + (f":{self.function}" if self.function else ""))


BUILTIN_FP8 = {
    "fp8_e4m3": "8-bit float multiplier, OCP E4M3 operands (saturating, round to nearest even), "
                "exact products, float32 sums",
    "fp8_e5m2": "8-bit float multiplier, OCP E5M2 operands (saturating, round to nearest even), "
                "exact products, float32 sums",
}
FP8_FORMS = ("'fp8_e4m3' / 'fp8_e5m2' (exact), or 'fp8_e4m3:FILE.c[:FUNCTION]' / "
             "'fp8_e5m2:TABLE.npy' for an FP8 multiplier of your own")


def parse_fp8_spec(spec) -> Fp8Spec | None:
    """The Fp8Spec a spec string names, None if it is not an FP8 spec; KernelSpecError for an
    FP8 spec whose file part is neither a .c source nor a .npy table."""
    match = _FP8_SPEC.match(spec) if isinstance(spec, str) else None
    if match is None:
        return None
    fmt = FORMATS[match.group("format")]
    rest = match.group("file")
    if rest is None:
        return Fp8Spec(fmt)
    c = _C_FILE.match(rest)
    if c:
        return Fp8Spec(fmt, "c", c.group("path"), c.group("function"))
    if rest.lower().endswith(".npy"):
        return Fp8Spec(fmt, "npy", rest)
    raise KernelSpecError(f"FP8 kernel {spec!r}: the file part must be a C source (.c, "
                          f"optionally ':FUNCTION') or a float32 table (.npy); use {FP8_FORMS}")


class Fp8Kernel(Kernel):
    """An 8-bit floating-point multiplier: FP8 quantization around a float32 GEMM / table GEMM
    (module docstring).  `table` None: exact products."""

    quantizes = True
    signed = True          # symmetric weights, a sign bit in every code
    multiplier = None      # no integer table: lut_grad and integer metrics do not apply
    has_lut_grad = False   # swapped layers refuse backward="lut_grad" (module docstring)

    def __init__(self, fp8_spec: Fp8Spec, table: np.ndarray | None = None,
                 sha256: str | None = None, description: str | None = None,
                 header_metrics: dict | None = None):
        self.fp8_spec = fp8_spec
        self.format = fp8_spec.format
        self.spec = fp8_spec.spec
        self.path = fp8_spec.path
        self.sha256 = sha256
        self.table = None
        self._header = dict(header_metrics or {})
        if table is not None:
            finite = self.format.finite_codes
            read = table[np.ix_(finite, finite)]
            if not np.isfinite(read).all():
                a, b = np.argwhere(~np.isfinite(read))[0]
                codes = np.flatnonzero(finite)
                raise KernelSpecError(
                    f"{fp8_spec.path}: the product of finite FP8 codes {codes[a]:#04x} x "
                    f"{codes[b]:#04x} is {read[a, b]}; an FP8 multiplier's products of finite "
                    f"operands must be finite")
            self.table = np.ascontiguousarray(table, dtype=np.float32).reshape(-1)
        self.description = description or BUILTIN_FP8.get(self.spec, self.spec)
        self._library = native.shipped_library()

    def to_config(self) -> dict:
        if self.fp8_spec.kind is None:
            return {"spec": self.spec}
        return {"spec": self.spec, "path": self.path, "sha256": self.sha256}

    @property
    def name(self) -> str:
        """A short name: the format's built-in name, or the C function / table file stem."""
        if self.fp8_spec.kind is None:
            return self.spec
        return self.fp8_spec.function or os.path.splitext(os.path.basename(self.path))[0]

    @property
    def header_metrics(self) -> dict:
        """The figures a C source's header carries (PDK45_PWR, ...; as for integer circuits)."""
        return dict(self._header)

    @property
    def hardware_metrics(self) -> dict:
        return {k: v for k, v in self._header.items() if k.startswith("PDK45")}

    def exact_products(self) -> "Fp8Kernel":
        """The exact multiplier of the same format (what bias compensation compares with)."""
        return Fp8Kernel(Fp8Spec(self.format))

    def describe_scheme(self, scheme: QuantScheme) -> str:
        """The report's quantization line: the FP8 format and each operand's scale
        granularity (the integer kernels' line says int8 / uint8)."""
        fmt = f"FP8 {self.format.name.upper()}"
        weights = f"{fmt} weights, scale {scheme.granularity.replace('_', '-')}"
        if scheme.activations == "dynamic":
            return f"{weights}, {fmt} activations, one scale per call (dynamic)"
        if scheme.activation_range is None:
            return f"{weights}, {fmt} activations, one static scale (calibrated)"
        lo, hi = scheme.activation_range
        activations = f"{fmt} activations, one static scale from [{lo:.4g}, {hi:.4g}]"
        if scheme.observer == "moving_average":
            activations += f" (moving average, momentum {scheme.momentum:g})"
        return f"{weights}, {activations}"

    def resolve_scheme(self, quant: QuantScheme | None) -> QuantScheme:
        scheme = (quant if quant is not None else QuantScheme()).resolve(True)
        if not scheme.calibrated:
            raise QuantizationError(
                f"{self.spec}: static activations need a calibrated activation range; calibrate "
                f"the model (rewrite_model(..., calibration_data=...), --calibrate DATA)")
        return scheme

    def products_table(self) -> np.ndarray:
        """The float32 table (256, 256) this kernel multiplies with (exact: decode x decode)."""
        if self.table is not None:
            return self.table.reshape(256, 256)
        values = self.format.values.astype(np.float32)
        with np.errstate(invalid="ignore"):
            return np.multiply.outer(values, values).astype(np.float32)

    def _code_matmul(self, qa: np.ndarray, qb: np.ndarray) -> np.ndarray:
        if self.table is None:
            return self._library.matmul_f32(decode(qa, self.format), decode(qb, self.format))
        return self._library.lut_float_matmul(qa, qb, self.table)

    def matmul(self, a, b, quant=None):
        a, b = matmul_operands(a, b)
        scheme = self.resolve_scheme(quant)
        if a.size == 0 or b.size == 0:
            return np.zeros((a.shape[0], b.shape[1]), np.float32)
        qa, sa, bad_a = quantize_activations(a, scheme, self.format)
        qb, sb, bad_b = quantize_weights(b, scheme, self.format)
        out = (self._code_matmul(qa, qb).astype(np.float64) * (sa * sb)[None, :])
        out = out.astype(np.float32)
        if bad_a is not None:
            out[bad_a.any(axis=1)] = np.nan
        if bad_b is not None:
            out[:, bad_b.any(axis=0)] = np.nan
        return out

    def conv2d(self, x, w, geometry, quant=None):
        x = np.asarray(x, dtype=np.float32)
        w = np.asarray(w, dtype=np.float32)
        scheme = self.resolve_scheme(quant)
        if 0 in geometry.output_shape or x.size == 0 or w.size == 0:
            return np.zeros(geometry.output_shape, np.float32)
        qx, sx, bad_x = quantize_activations(x, scheme, self.format)
        qw, sw, bad_w = quantize_weights(w, scheme, self.format)
        vx, vw = decode(qx, self.format), decode(qw, self.format)
        if self.table is None:
            acc = self._library.conv2d_f32(vx, vw, geometry)
        else:
            fmt = self.format

            def table_matmul(cols, filt):
                return self._library.lut_float_matmul(encode(cols, fmt), encode(filt, fmt),
                                                      self.table)
            acc = native.conv_via_matmul(vx, vw, geometry, table_matmul)
        out = (acc.astype(np.float64) * (sx * sw)).astype(np.float32)
        if bad_x is not None:
            # windows that touch a non-finite input: the same conv over the indicator
            indicator = bad_x.astype(np.float32)
            ones = np.ones_like(w)
            touched = self._library.conv2d_f32(indicator, ones, geometry) > 0
            out[touched] = np.nan
        if bad_w is not None:
            out[..., bad_w.reshape(-1, w.shape[-1]).any(axis=0)] = np.nan
        return out


def builtin_fp8_kernel(name: str) -> Fp8Kernel:
    """The exact FP8 kernel `name` ("fp8_e4m3" / "fp8_e5m2")."""
    parsed = parse_fp8_spec(name)
    if parsed is None or parsed.kind is not None:
        raise KernelSpecError(f"unknown FP8 kernel {name!r}; use {FP8_FORMS}")
    return Fp8Kernel(parsed)


def file_fp8_kernel(parsed: Fp8Spec, content: native.FileContent) -> Fp8Kernel:
    """The FP8 kernel of a user's multiplier file whose bytes were read (and checked) once."""
    name = os.path.basename(content.path)
    if parsed.kind == "c":
        table, function, header = fp8_circuits.table_from_c(content, parsed.function)
        description = (f"8-bit float multiplier {function} from {name}, "
                       f"{parsed.format.name.upper()} operands, float32 sums")
    else:
        table, header = fp8_circuits.table_from_npy(content), {}
        description = (f"8-bit float multiplier table {name}, {parsed.format.name.upper()} "
                       f"operands, float32 sums")
    return Fp8Kernel(parsed.at(content.path), table, content.sha256, description, header)
