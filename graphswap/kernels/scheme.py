"""QuantScheme: how a multiplier kernel quantizes, as one small explicit, frozen structure.

A swapped layer holds one QuantScheme (its config key "quantization") and passes it, with the
static activation range filled in, to every kernel call: `Kernel.matmul(a, b, quant=scheme)` /
`Kernel.conv2d(x, w, geometry, quant=scheme)`.  Float kernels ignore it; LutKernel follows it
exactly as graphswap/kernels/quantized.py's docstring specifies.

Fields (all validated; `to_config`/`from_config` round-trip through JSON exactly):

    weights       "sign_magnitude" | "asymmetric" | "symmetric" | None
                  None = the multiplier's default: sign_magnitude for unsigned multipliers,
                  symmetric for signed ones.  Unsigned multipliers accept sign_magnitude or
                  asymmetric (TFApprox); signed ones accept symmetric.
    granularity   "per_channel" | "per_tensor"   (weight scales and zero points)
    activations   "dynamic" (range of each call's tensor, i.e. of the batch, as TFApprox) |
                  "static" (the calibrated `activation_range`, the same for every call)
    activation_range  (lo, hi) of a static layer input, float32-representable numbers; a static
                  scheme without one is a request (calibration fills it in), which kernels refuse
                  to run
    observer      "fixed" (the static range never changes) | "moving_average" (in training calls
                  the range follows lo <- m lo + (1 - m) min(batch), hi likewise, m = momentum,
                  as QAT observers do; inference calls never change it)
    momentum      the moving average's m, 0 <= m < 1
    operands      "activation_first" (the activation code is the multiplier's first operand A,
                  the weight code its second, B: T[qa, qw]) | "weight_first" (the weight feeds A
                  and the activation B: T[qw, qa]).  An approximate circuit is rarely symmetric
                  (EvoApproxLib's keep different partial products of A and B), so which port the
                  weights are wired to is a hardware choice that changes the error; the codes,
                  scales and sums are the same either way (LutKernel.oriented)
    activation_offset  an integer o added to each activation code before the multiplier sees it
                  (saturating at the code range), with no correction: the requantizer rounding
                  into the circuit's own grid.  A circuit that drops an operand's low bits
                  (mul8s_1L1G keeps 8 * floor(a / 8)) floors every activation; o = 4 makes that
                  a rounding to the nearest multiple of 8.  The sums count the codes as they were
                  (the exact products' reference does not move); measured per layer with the
                  wiring (graphswap/swap/wiring.py); 0 by default
    activation_zero_point  0 (symmetric int8 activations: a non-negative input uses codes 0..127
                  only) | -128 (signed multipliers, static activations of a range [0, hi]: TFLite
                  int8's zero point for a ReLU output - codes q = clip(rint(x / s), 0, 255),
                  s = hi / 255, the circuit sees q - 128, and the zero-point term is the
                  circuit's own product of the zero point with each weight, summed per output
                  channel from the weights alone (as TFLite precomputes 128 * sum w), so
                  T'[q, w] = T[q - 128, w] - T[-128, w]: a zero input adds nothing, and every
                  one of the 256 codes carries a level, one bit more than symmetric codes of a
                  non-negative range; for the exact table T'[q, w] = q w).  Negative inputs
                  clip to 0.  Measured per layer with the wiring

Which hardware each mode matches:
    sign_magnitude, per_channel  a sign-magnitude MAC array: the unsigned multiplier sees |w|'s
                                 8-bit magnitude, the product takes w's sign; one scale per output
                                 channel (requantization per channel), weight zero point 0
    asymmetric, per_tensor       TFApprox / gemmlowp-style uint8 with one scale and zero point per
                                 tensor; zero-point cross terms corrected exactly outside the
                                 multiplier
    asymmetric, per_channel      the same with per-output-channel weight scales and zero points
    symmetric, per_channel       int8 accelerators (TFLite int8, AdaPT, TransAxx): zero point 0,
                                 one weight scale per output channel
    symmetric, per_tensor        int8 with one weight scale per tensor
    activations static           every int8 accelerator: scales fixed at calibration
    activations dynamic          TFApprox (range of each call); not what hardware runs
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from graphswap.errors import QuantizationError

WEIGHT_ENCODINGS = ("sign_magnitude", "asymmetric", "symmetric")
GRANULARITIES = ("per_channel", "per_tensor")
ACTIVATION_MODES = ("dynamic", "static")
OBSERVERS = ("fixed", "moving_average")
OPERAND_ORDERS = ("activation_first", "weight_first")
#: QuantScheme.activation_zero_point's values: symmetric codes, or TFLite's -128 (ReLU outputs)
ZERO_POINTS = (0, -128)
DEFAULT_MOMENTUM = 0.99

UNSIGNED_ENCODINGS = ("sign_magnitude", "asymmetric")
SIGNED_ENCODINGS = ("symmetric",)


def _choice(value, allowed, what):
    if value not in allowed:
        raise QuantizationError(f"{what} must be one of {', '.join(allowed)}; got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class QuantScheme:
    """How a multiplier kernel quantizes (see the module docstring)."""

    weights: str | None = None
    granularity: str = "per_channel"
    activations: str = "dynamic"
    activation_range: tuple | None = None
    observer: str = "fixed"
    momentum: float = DEFAULT_MOMENTUM
    operands: str = "activation_first"
    activation_offset: int = 0
    activation_zero_point: int = 0

    def __post_init__(self):
        if self.weights is not None:
            _choice(self.weights, WEIGHT_ENCODINGS, "weight encoding")
        _choice(self.granularity, GRANULARITIES, "weight granularity")
        _choice(self.activations, ACTIVATION_MODES, "activation mode")
        _choice(self.observer, OBSERVERS, "observer")
        _choice(self.operands, OPERAND_ORDERS, "operand order")
        momentum = self.momentum
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) \
                or not 0 <= momentum < 1:
            raise QuantizationError(f"observer momentum must be a number in [0, 1); got "
                                   f"{momentum!r}")
        object.__setattr__(self, "momentum", float(momentum))
        offset = self.activation_offset
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) \
                or not -255 <= offset <= 255:
            raise QuantizationError(f"activation_offset must be an integer from -255 to 255 (added "
                                   f"to each activation code); got {offset!r}")
        object.__setattr__(self, "activation_offset", int(offset))
        zero_point = self.activation_zero_point
        if isinstance(zero_point, bool) or zero_point not in ZERO_POINTS:
            raise QuantizationError(f"activation_zero_point must be 0 or -128 (TFLite int8's zero "
                                    f"point for a non-negative input); got {zero_point!r}")
        object.__setattr__(self, "activation_zero_point", int(zero_point))
        if zero_point and self.activations != "static":
            raise QuantizationError("activation_zero_point -128 needs static activations (a "
                                    "calibrated range [0, hi]); calibrate the layer, or leave "
                                    "the zero point at 0")
        if self.activation_range is not None:
            object.__setattr__(self, "activation_range", as_range(self.activation_range))

    # -- resolving against a multiplier --------------------------------------------------------
    def resolve(self, signed: bool) -> "QuantScheme":
        """This scheme with `weights` chosen for a (signed or unsigned) multiplier; raises
        QuantizationError if the encoding cannot run on it."""
        allowed = SIGNED_ENCODINGS if signed else UNSIGNED_ENCODINGS
        weights = self.weights if self.weights is not None else allowed[0]
        if self.activation_zero_point and not signed:
            raise QuantizationError("activation_zero_point -128 is for signed (mul8s) "
                                    "multipliers; an unsigned one's activation codes already "
                                    "use 0..255 (its zero point comes from the range)")
        if weights not in allowed:
            kind = "signed (mul8s)" if signed else "unsigned (mul8u)"
            raise QuantizationError(
                f"weight encoding {weights!r} cannot run on a {kind} multiplier; allowed: "
                f"{', '.join(allowed)}")
        return dataclasses.replace(self, weights=weights)

    def with_range(self, lo, hi) -> "QuantScheme":
        """Static activations with the range (lo, hi)."""
        return dataclasses.replace(self, activations="static", activation_range=(lo, hi))

    def dynamic(self) -> "QuantScheme":
        return dataclasses.replace(self, activations="dynamic", activation_range=None,
                                   activation_zero_point=0)

    # -- config --------------------------------------------------------------------------------
    def to_config(self) -> dict:
        config = {"weights": self.weights, "granularity": self.granularity,
                  "activations": self.activations,
                  "activation_range": None if self.activation_range is None
                  else [float(v) for v in self.activation_range],
                  "observer": self.observer, "momentum": self.momentum}
        if self.operands != "activation_first":   # files of the default read by older versions
            config["operands"] = self.operands
        if self.activation_offset:
            config["activation_offset"] = self.activation_offset
        if self.activation_zero_point:
            config["activation_zero_point"] = self.activation_zero_point
        return config

    @classmethod
    def from_config(cls, config) -> "QuantScheme":
        if config is None:
            return cls()
        if isinstance(config, QuantScheme):
            return config
        if not isinstance(config, dict):
            raise QuantizationError(f"a quantization config is a dict with keys "
                                   f"{', '.join(f.name for f in dataclasses.fields(cls))}; got "
                                   f"{type(config).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise QuantizationError(f"unknown quantization setting(s) {', '.join(unknown)}; "
                                   f"allowed: {', '.join(sorted(known))}")
        values = dict(config)
        if values.get("activation_range") is not None:
            values["activation_range"] = tuple(values["activation_range"])
        return cls(**values)

    @property
    def calibrated(self) -> bool:
        """Whether the scheme can run: dynamic, or static with its range."""
        return self.activations == "dynamic" or self.activation_range is not None

    def describe(self, weight_bits: int = 8, activation_bits: int = 8) -> str:
        """One line for reports, naming the mode (and the hardware it matches); `weight_bits`:
        an 8xN multiplier's N (its weights are quantized to N bits); `activation_bits`: an Nx8
        multiplier's N (its activations are quantized to N bits)."""
        weights = {"sign_magnitude": "sign-magnitude", "asymmetric": "asymmetric uint8",
                   "symmetric": "symmetric int8", None: "default"}[self.weights]
        if weight_bits != 8:
            weights = {"sign_magnitude": f"{weight_bits}-bit sign-magnitude",
                       "asymmetric": f"asymmetric {weight_bits}-bit",
                       "symmetric": f"symmetric {weight_bits}-bit",
                       None: f"{weight_bits}-bit"}[self.weights]
        granularity = self.granularity.replace("_", "-")
        if self.activations == "static" and self.activation_range is None:
            activations = "static activations (calibrated)"
        elif self.activations == "static":
            lo, hi = self.activation_range
            activations = f"static activations [{lo:.4g}, {hi:.4g}]"
            if self.observer == "moving_average":
                activations += f" (moving average, momentum {self.momentum:g})"
        else:
            activations = "dynamic activations (range per call, as TFApprox)"
        if activation_bits != 8:
            activations = f"{activation_bits}-bit {activations}"
        wiring = ", weights on the multiplier's first operand" \
            if self.operands == "weight_first" else ""
        if self.activation_zero_point:
            wiring += f", activation zero point {self.activation_zero_point}"
        if self.activation_offset:
            wiring += f", activation codes {self.activation_offset:+d} into the multiplier"
        return f"{weights} weights {granularity}, {activations}{wiring}"


def as_range(value) -> tuple:
    """(lo, hi) checked (finite, lo <= hi) and rounded to float32 values; raises
    QuantizationError."""
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise QuantizationError(f"an activation range is two numbers (lo, hi); got "
                               f"{value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise QuantizationError(f"an activation range needs finite lo <= hi; got ({lo}, {hi})")
    # stored as float32 values (what a layer keeps), read as float64 for the scale arithmetic
    return float(np.float32(lo)), float(np.float32(hi))


def wired_table(table, operands: str, activation_offset: int, signed: bool,
                activation_zero_point: int = 0) -> np.ndarray:
    """A 256x256 multiplier table T[a, b] as a scheme wires it, indexed [activation code, weight
    code]: transposed for "weight_first", its activation axis moved by `activation_offset` codes
    (two's complement values when signed; saturating at the code range).  With the zero point
    -128 (signed only) row q is unsigned code q: the circuit's row of q - 128 (+ the offset) less
    its row of code 0 (the zero-point term, scheme docstring)."""
    table = np.asarray(table).reshape(256, 256)
    table = table.T if operands == "weight_first" else table
    codes = np.arange(256)
    if not signed:
        return table[np.clip(codes + activation_offset, 0, 255)]
    code_values = np.where(codes >= 128, codes - 256, codes)
    if activation_zero_point:
        values = np.clip(codes + activation_zero_point + activation_offset, -128, 127)
        moved = table[np.where(values < 0, values + 256, values)].astype(np.int64)
        return moved - moved[0][None, :]       # a zero input (code 0) adds nothing
    values = np.clip(code_values + activation_offset, -128, 127)
    return table[np.where(values < 0, values + 256, values)]


def activation_codes_signed(signed: bool, scheme) -> bool:
    """Whether a (signed or unsigned) multiplier's activation codes are two's complement under
    `scheme`: a signed one's are, unless its activation zero point is -128 (codes 0..255)."""
    return bool(signed) and not getattr(scheme, "activation_zero_point", 0)


def tfapprox_scheme() -> QuantScheme:
    """TFApprox's quantization: asymmetric uint8 per tensor, dynamic (per-call) activations."""
    return QuantScheme(weights="asymmetric", granularity="per_tensor", activations="dynamic")
