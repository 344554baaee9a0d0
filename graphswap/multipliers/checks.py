"""Sanity checks of a multiplier's table for `graphswap kernels check`, and their report."""

from __future__ import annotations

import dataclasses

import numpy as np

from graphswap.multipliers.metrics import (agrees_with_header, errors, metrics, operand_axes,
                                           operand_levels)
from graphswap.multipliers.record import Multiplier, embed_weight_table


#: header metrics compared as checks (the others are shown beside the computed values)
CHECKED_HEADER_METRICS = ("MAE%", "WCE%", "WCRE%", "EP%")


def check_entry(name: str, passed, detail: str, warning: bool = False) -> dict:
    """One line of a check report: passed True (ok), False (FAIL), None (info, or a warning:
    a fact worth knowing that is not an error)."""
    status = {True: "ok", False: "FAIL"}.get(passed, "warn" if warning else "info")
    return {"check": name, "passed": passed, "status": status, "detail": detail}


def _zero_operand_check(approx, first_values, second_values, axis) -> dict:
    """f(a, 0) = 0 (axis 1) or f(0, b) = 0 (axis 0): a published circuit may break it (EvoApproxLib
    mul8u_2AC has f(0, 0) = 32), so a violation is a warning stating the fact, not a failure."""
    zero_a = int(np.flatnonzero(first_values == 0)[0])
    zero_b = int(np.flatnonzero(second_values == 0)[0])
    line = approx[:, zero_b] if axis == 1 else approx[zero_a, :]
    values = first_values if axis == 1 else second_values
    name, other = ("f(a, 0) = 0", "a") if axis == 1 else ("f(0, b) = 0", "b")
    bad = np.flatnonzero(line)
    if bad.size == 0:
        return check_entry(name, True, f"holds for every {other}")
    first = int(values[bad[0]])
    example = f"f({first}, 0)" if axis == 1 else f"f(0, {first})"
    at_zero = "" if first == 0 else f", f(0, 0) = {approx[zero_a, zero_b]}"
    return check_entry(
        name, None,
        f"non-zero for {bad.size} of {len(values)} values of {other} ({example} = "
        f"{line[bad[0]]}{at_zero}): "
        f"a property of this circuit, not an error - a zero operand does not give a zero "
        f"product, and graphswap runs the table as it is", warning=True)


def _signedness_check(multiplier: Multiplier, approx, error, computed) -> dict:
    """Does the table fit the declared signedness better than the other reading of its bits?
    A header whose metrics match the declared reading settles it (EvoApproxLib mul8u_E9R, which
    always returns 0, "looks signed" by MAE alone)."""
    kind = "signed" if multiplier.signed else "unsigned"
    other_kind = "unsigned" if multiplier.signed else "signed"
    bits = multiplier.activation_bits + multiplier.weight_bits  # the product's width
    mask, half = 2 ** bits - 1, 2 ** (bits - 1)
    other_table = approx & mask if multiplier.signed else np.where(approx >= half,
                                                                    approx - 2 ** bits, approx)
    if multiplier.width == "8x8":
        table = other_table.astype(np.int32).ravel()
    else:  # the same rows / columns (N-bit codes) read the other way
        table = embed_weight_table(other_table, not multiplier.signed, multiplier.weight_bits,
                                   multiplier.spec, multiplier.activation_bits)
    other = dataclasses.replace(multiplier, signed=not multiplier.signed, table=table)
    other_computed = metrics(other)
    mae_declared, mae_other = computed["MAE"], other_computed["MAE"]
    texts = {k: multiplier.header_metrics_text[k] for k in CHECKED_HEADER_METRICS
             if k in multiplier.header_metrics_text}
    by_mae = (f"treated as {kind}: MAE {mae_declared:.4g} vs the {kind} product; read as "
              f"{other_kind} it would be {mae_other:.4g}")
    if texts and all(agrees_with_header(computed[k], t) for k, t in texts.items()):
        return check_entry("signedness plausibility", True,
                           f"the header's {', '.join(texts)} match the {kind} reading ({by_mae})")
    if texts and all(agrees_with_header(other_computed[k], t) for k, t in texts.items()):
        return check_entry("signedness plausibility", False,
                           f"the header's {', '.join(texts)} match the {other_kind} reading, not "
                           f"the declared {kind} one: check the declaration ({by_mae})")
    plausible = mae_declared <= mae_other
    return check_entry("signedness plausibility", plausible, by_mae + (
        "" if plausible else f" -- the table looks {other_kind}: check the declaration"))


def _resolution_detail(multiplier: Multiplier) -> str:
    levels = operand_levels(multiplier)

    def shown(count, of):
        return f"{count} of {of} values told apart ({np.log2(count):.1f} bits)"

    return (f"first operand (activation): "
            f"{shown(levels['first'], 2 ** multiplier.activation_bits)}, "
            f"{levels['first_nonnegative']} of the {levels['nonnegative_values']} non-negative "
            f"ones (what a ReLU output uses); second operand (weight): "
            f"{shown(levels['second'], 2 ** multiplier.weight_bits)}")


def check(multiplier: Multiplier) -> dict:
    """Sanity checks and metrics of a multiplier, for `graphswap kernels check`."""
    approx, exact, error = errors(multiplier)
    first_values, second_values = operand_axes(multiplier)
    computed = metrics(multiplier)
    checks = [_zero_operand_check(approx, first_values, second_values, axis=1),
              _zero_operand_check(approx, first_values, second_values, axis=0)]
    exact_pairs = int(np.count_nonzero(error == 0))
    worst = np.unravel_index(np.abs(error).argmax(), error.shape)
    checks.append(check_entry(
        "comparison with the exact product", None,
        f"{exact_pairs} of {error.size} operand pairs exact; largest error "
        f"{int(np.abs(error).max())} (at f({first_values[worst[0]]}, {second_values[worst[1]]}))"))
    if multiplier.width == "8x8":
        asymmetric = int(np.count_nonzero(approx != approx.T)) // 2
        checks.append(check_entry(
            "operand-order symmetry", None,
            "f(a, b) = f(b, a) for every pair: operand order does not matter" if asymmetric == 0
            else f"f(a, b) != f(b, a) for {asymmetric} unordered pairs: operand order matters "
                 f"(first operand = activation, second = weight)"))
    elif multiplier.activation_bits != 8:
        bits = multiplier.activation_bits
        checks.append(check_entry(
            "operand widths", None,
            f"{bits}x8: {bits}-bit activation (first operand) x 8-bit weight (second operand); "
            f"the activations are quantized to {bits} bits; metrics at the {bits + 8}-bit "
            f"output width"))
    else:
        checks.append(check_entry(
            "operand widths", None,
            f"8x{multiplier.weight_bits}: 8-bit activation (first operand) x "
            f"{multiplier.weight_bits}-bit weight (second operand); the weights are quantized to "
            f"{multiplier.weight_bits} bits; metrics at the {8 + multiplier.weight_bits}-bit "
            f"output width"))
    checks.append(_signedness_check(multiplier, approx, error, computed))
    checks.append(check_entry("operand resolution", None, _resolution_detail(multiplier)))
    comparison = []
    for key in ("MAE%", "WCE%", "WCRE%", "EP%", "MRE%", "MAE", "WCE", "MSE"):
        if key in multiplier.header_metrics_text:
            text = multiplier.header_metrics_text[key]
            ok = agrees_with_header(computed[key], text)
            comparison.append({"metric": key, "computed": computed[key], "header": text, "agrees": ok})
    for entry in comparison:
        if entry["metric"] in CHECKED_HEADER_METRICS:
            checks.append(check_entry(f"header {entry['metric']} agrees", entry["agrees"],
                                      f"computed {entry['computed']:.6g}, header {entry['header']}"))
    hardware = {k: v for k, v in multiplier.header_metrics.items() if k.startswith("PDK45")}
    return {
        "spec": multiplier.spec, "name": multiplier.name, "signed": multiplier.signed,
        "width": multiplier.width,
        "description": multiplier.description, "notes": list(multiplier.notes), "checks": checks,
        "metrics": computed, "header_comparison": comparison, "hardware": hardware,
        "passed": all(c["passed"] is not False for c in checks),
    }


def format_check_lines(checks: list[dict]) -> list[str]:
    """One line per check: [ok  ] / [FAIL] / [warn] / [info], name, detail (a detail of several
    lines - a compiler's output - continues indented under the first)."""
    width = max((len(c["check"]) for c in checks), default=0)
    lines = []
    for c in checks:
        status = c.get("status") or {True: "ok", False: "FAIL"}.get(c["passed"], "info")
        first, *rest = str(c["detail"]).splitlines() or [""]
        lines.append(f"  [{status:<4}] {c['check']:<{width}}  {first}")
        lines.extend(f"  {'':<6} {'':<{width}}  {line}" for line in rest)
    return lines


def format_check(result: dict) -> str:
    """A readable report of check()'s result."""
    width = "" if result.get("width", "8x8") == "8x8" else f", {result['width']}"
    lines = [f"multiplier  {result['name']}  ({'signed' if result['signed'] else 'unsigned'}"
             f"{width})",
             f"spec        {result['spec']}", f"            {result['description']}"]
    for note in result["notes"]:
        lines.append(f"note        {note}")
    lines.append("")
    lines.extend(format_check_lines(result["checks"]))
    lines.append("")
    header = {e["metric"]: e for e in result["header_comparison"]}
    lines.append(f"  {'metric':<8} {'computed':>14} {'header':>12}")
    for key, value in result["metrics"].items():
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        extra = ""
        if key in header:
            extra = f"{header[key]['header']:>12}  {'agrees' if header[key]['agrees'] else 'DIFFERS'}"
        lines.append(f"  {key:<8} {shown:>14} {extra}")
    for key, value in result["hardware"].items():
        lines.append(f"  {key:<12} {value:g} (from the file's header)")
    lines.append("")
    lines.append(verdict(result))
    return "\n".join(lines)


def verdict(result: dict) -> str:
    """The report's last line: passed (and how many warnings) or FAILED."""
    if not result["passed"]:
        return "some checks FAILED"
    warnings = sum(1 for c in result["checks"] if c.get("status") == "warn")
    return "all checks passed" + (f" ({warnings} warning{'s' * (warnings > 1)})" if warnings else "")

