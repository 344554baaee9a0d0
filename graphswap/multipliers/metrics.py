"""Error metrics of a multiplier, computed from its table (EvoApproxLib conventions), the metrics
an EvoApproxLib file prints in its header, and whether the two agree."""

from __future__ import annotations

import math
import re

import numpy as np

from graphswap.errors import KernelSpecError
from graphswap.multipliers.record import Multiplier, operand_values, weight_values

HEADER_KEYS = ("MAE%", "MAE", "WCE%", "WCE", "WCRE%", "EP%", "MRE%", "MSE",
               "PDK45_PWR", "PDK45_AREA", "PDK45_DELAY")
#: the circuit's hardware figures (power in mW, area in um^2, delay in ns): numbers >= 0
HARDWARE_KEYS = ("PDK45_PWR", "PDK45_AREA", "PDK45_DELAY")
_HEADER_LINE = re.compile(
    r"^\s*//\s*(MAE%|MAE|WCE%|WCE|WCRE%|EP%|MRE%|MSE|PDK45_PWR|PDK45_AREA|PDK45_DELAY)\s*=\s*"
    r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?i:nan|inf(?:inity)?)\b)",
    re.MULTILINE)


def parse_header_metrics(source: str, path: str = "the multiplier source") -> tuple[dict, dict]:
    """EvoApproxLib header metrics ("// MAE% = 0.0034 %") -> ({key: float}, {key: printed text}).

    A hardware figure (PDK45_PWR / _AREA / _DELAY) that is negative, NaN or infinite is refused
    (KernelSpecError naming `path`, the line and the value); a NaN or infinite error metric is
    left out, as if the line were not there."""
    values, texts = {}, {}
    for key, text in _HEADER_LINE.findall(source):
        if key in values:
            continue
        value = float(text)
        if key in HARDWARE_KEYS and not (math.isfinite(value) and value >= 0):
            raise KernelSpecError(
                f"{path}: its header says '{key} = {text}'; a hardware figure (PDK45_PWR in mW, "
                f"PDK45_AREA, PDK45_DELAY) must be a finite number >= 0. Correct that line of the "
                f"header, or remove it and give the figure another way (sweep --power, a metrics "
                f"table for explore)")
        if math.isfinite(value):
            values[key] = value
            texts[key] = text
    return values, texts



def lut(multiplier: Multiplier) -> np.ndarray:
    """The multiplier as a 256x256 int array: out[i, j] = product of the i-th and j-th operand values,
    rows = first operand (activation), columns = second operand (weight).  Unsigned: operands 0..255.
    Signed: rows and columns ordered by value -128..127 (so out[128, 128] = f(0, 0)).  An 8xN
    multiplier's array is its embedded layout (record.py): only the columns of the N-bit weight
    values are the circuit's, the others hold exact products; Multiplier.weight_table() is the
    circuit's own 256 x 2^N function."""
    table = multiplier.table.reshape(256, 256)
    if multiplier.signed:
        order = (np.arange(256) + 128) % 256  # position i holds the code of value i - 128
        table = table[np.ix_(order, order)]
    return np.array(table, dtype=np.int64)


def operand_axes(multiplier: Multiplier) -> tuple[np.ndarray, np.ndarray]:
    """(values of the first operand's codes, values of the second operand's codes): 256 codes
    each for an 8x8 multiplier, the 2^N N-bit codes of the narrow operand of an 8xN / Nx8 one
    (record.weight_values)."""
    return (weight_values(multiplier.signed, multiplier.activation_bits),
            weight_values(multiplier.signed, multiplier.weight_bits))


def errors(multiplier: Multiplier):
    """(approx, exact, approx - exact) over all operand pairs in code order: 256x256, or
    256 x 2^N for an 8xN multiplier, 2^N x 256 for an Nx8 one (its own domain, Multiplier.weight_table())."""
    first, second = operand_axes(multiplier)
    exact = first[:, None] * second[None, :]
    approx = multiplier.weight_table()
    return approx, exact, approx - exact


def output_bits(multiplier: Multiplier) -> int:
    """Width of the circuit's exact product: 16 for 8x8, 8 + N for 8xN and Nx8."""
    return multiplier.activation_bits + multiplier.weight_bits


def metrics(multiplier: Multiplier) -> dict:
    """Error metrics of the multiplier over all its operand pairs (65536 for 8x8, 256 * 2^N for
    8xN), EvoApproxLib conventions at the circuit's own output width W (16 for 8x8, 8 + N for
    8xN): MAE = mean|approx - exact|, MAE% = MAE / 2^W * 100, WCE = max|approx - exact|,
    WCE% = WCE / 2^W * 100, EP% = share of pairs with any error, MRE% = mean over pairs with a
    non-zero exact product of |error| / |exact| * 100, WCRE% = the maximum of that ratio * 100,
    MSE = mean error^2, bias = mean(approx - exact)."""
    _, exact, error = errors(multiplier)
    abs_error = np.abs(error)
    nonzero = exact != 0
    relative = abs_error[nonzero] / np.abs(exact[nonzero])
    full_scale = 2 ** output_bits(multiplier)
    return {
        "MAE": float(abs_error.mean()),
        "MAE%": float(abs_error.mean() / full_scale * 100),
        "WCE": int(abs_error.max()),
        "WCE%": float(abs_error.max() / full_scale * 100),
        "MRE%": float(relative.mean() * 100),
        "WCRE%": float(relative.max() * 100),
        "EP%": float(np.count_nonzero(error) / error.size * 100),
        "MSE": float((error.astype(np.float64) ** 2).mean()),
        "bias": float(error.mean()),
    }


def operand_levels(multiplier: Multiplier) -> dict:
    """How many values of each operand the multiplier tells apart.  Two values a, a' of the first
    operand are one level when f(a, b) = f(a', b) for every b (equal table rows): DRUM-k keeps k
    bits from the leading one, so mul8u_drum3 has 18 levels, an exact multiplier 256.  A network's
    activations reach the multiplier only through these levels, so they bound its resolution the
    way a coarser quantizer would - which MAE% does not show (it averages over all pairs).

    Returns {"first", "second": levels over all 256 values, "first_nonnegative": levels among the
    non-negative first-operand values (those a ReLU output can take: 0..127 for a signed
    multiplier, 0..255 unsigned), "nonnegative_values": how many such values there are}."""
    values = weight_values(multiplier.signed, multiplier.activation_bits)
    table = multiplier.weight_table()
    return {"first": len(np.unique(table, axis=0)), "second": np.unique(table, axis=1).shape[1],
            "first_nonnegative": len(np.unique(table[values >= 0], axis=0)),
            "nonnegative_values": int(np.count_nonzero(values >= 0))}


def _decimals(text: str) -> int:
    mantissa = text.lower().split("e")[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def agrees_with_header(computed: float, printed: str) -> bool:
    """Is the header's printed value `computed`, rounded or truncated to the printed precision?

    EvoApproxLib's headers do both: mul8u_18UH prints MAE% 1.17966 as 1.18 (rounded), mul8s_1KVB
    prints 0.006485 as 0.0064 (truncated); both are agreement, anything further off is not.
    """
    exponent = int(printed.lower().split("e")[1]) if "e" in printed.lower() else 0
    step = 10.0 ** (exponent - _decimals(printed))
    value = float(printed)
    tolerance = 1e-9 * step + 1e-12
    rounded = abs(computed - value) <= step / 2 + tolerance
    truncated = 0 <= abs(computed) - abs(value) < step + tolerance and \
        (computed == 0 or value == 0 or (computed > 0) == (value > 0))
    return rounded or truncated

