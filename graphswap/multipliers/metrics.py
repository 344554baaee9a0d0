"""Error metrics of a multiplier, computed from its table (EvoApproxLib conventions), the metrics
an EvoApproxLib file prints in its header, and whether the two agree."""

from __future__ import annotations

import re

import numpy as np

from graphswap.multipliers.record import Multiplier, operand_values

HEADER_KEYS = ("MAE%", "MAE", "WCE%", "WCE", "WCRE%", "EP%", "MRE%", "MSE",
               "PDK45_PWR", "PDK45_AREA", "PDK45_DELAY")
_HEADER_LINE = re.compile(
    r"^\s*//\s*(MAE%|MAE|WCE%|WCE|WCRE%|EP%|MRE%|MSE|PDK45_PWR|PDK45_AREA|PDK45_DELAY)\s*=\s*"
    r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)", re.MULTILINE)


def parse_header_metrics(source: str) -> tuple[dict, dict]:
    """EvoApproxLib header metrics ("// MAE% = 0.0034 %") -> ({key: float}, {key: printed text})."""
    values, texts = {}, {}
    for key, text in _HEADER_LINE.findall(source):
        if key not in values:
            values[key] = float(text)
            texts[key] = text
    return values, texts



def lut(multiplier: Multiplier) -> np.ndarray:
    """The multiplier as a 256x256 int array: out[i, j] = product of the i-th and j-th operand values,
    rows = first operand (activation), columns = second operand (weight).  Unsigned: operands 0..255.
    Signed: rows and columns ordered by value -128..127 (so out[128, 128] = f(0, 0))."""
    table = multiplier.table.reshape(256, 256)
    if multiplier.signed:
        order = (np.arange(256) + 128) % 256  # position i holds the code of value i - 128
        table = table[np.ix_(order, order)]
    return np.array(table, dtype=np.int64)


def errors(multiplier: Multiplier):
    """(approx, exact, approx - exact) over all operand pairs, 256x256 in code order."""
    values = operand_values(multiplier.signed)
    exact = values[:, None] * values[None, :]
    approx = multiplier.table.reshape(256, 256).astype(np.int64)
    return approx, exact, approx - exact


def metrics(multiplier: Multiplier) -> dict:
    """Error metrics of the multiplier over all 65536 operand pairs (EvoApproxLib conventions):
    MAE = mean|approx - exact|, MAE% = MAE / 2^16 * 100, WCE = max|approx - exact|,
    WCE% = WCE / 2^16 * 100, EP% = share of pairs with any error, MRE% = mean over pairs with a
    non-zero exact product of |error| / |exact| * 100, WCRE% = the maximum of that ratio * 100,
    MSE = mean error^2, bias = mean(approx - exact)."""
    _, exact, error = errors(multiplier)
    abs_error = np.abs(error)
    nonzero = exact != 0
    relative = abs_error[nonzero] / np.abs(exact[nonzero])
    return {
        "MAE": float(abs_error.mean()),
        "MAE%": float(abs_error.mean() / 2 ** 16 * 100),
        "WCE": int(abs_error.max()),
        "WCE%": float(abs_error.max() / 2 ** 16 * 100),
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
    values = operand_values(multiplier.signed)
    table = multiplier.table.reshape(256, 256)
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

