"""Sanity checks of a multiplier's table for `graphswap kernels check`, and their report."""

from __future__ import annotations

import numpy as np

from graphswap.multipliers.metrics import agrees_with_header, errors, metrics
from graphswap.multipliers.record import Multiplier, operand_values


def check(multiplier: Multiplier) -> dict:
    """Sanity checks and metrics of a multiplier, for `graphswap kernels check`."""
    approx, exact, error = errors(multiplier)
    values = operand_values(multiplier.signed)
    zero = int(np.flatnonzero(values == 0)[0])
    checks = []

    def add(name, passed, detail):
        checks.append({"check": name, "passed": passed, "detail": detail})

    bad_b0 = int(np.count_nonzero(approx[:, zero]))
    add("f(a, 0) = 0", bad_b0 == 0, "holds for every a" if bad_b0 == 0 else
        f"non-zero for {bad_b0} of 256 values of a (e.g. f({values[np.flatnonzero(approx[:, zero])[0]]}, 0)"
        f" = {approx[np.flatnonzero(approx[:, zero])[0], zero]})")
    bad_a0 = int(np.count_nonzero(approx[zero, :]))
    add("f(0, b) = 0", bad_a0 == 0, "holds for every b" if bad_a0 == 0 else
        f"non-zero for {bad_a0} of 256 values of b (e.g. f(0, {values[np.flatnonzero(approx[zero, :])[0]]})"
        f" = {approx[zero, np.flatnonzero(approx[zero, :])[0]]})")
    exact_pairs = int(np.count_nonzero(error == 0))
    add("comparison with the exact product", None,
        f"{exact_pairs} of 65536 operand pairs exact; largest error {int(np.abs(error).max())} "
        f"(at f({values[np.unravel_index(np.abs(error).argmax(), error.shape)[0]]}, "
        f"{values[np.unravel_index(np.abs(error).argmax(), error.shape)[1]]}))")
    asymmetric = int(np.count_nonzero(approx != approx.T)) // 2
    add("operand-order symmetry", None,
        "f(a, b) = f(b, a) for every pair: operand order does not matter" if asymmetric == 0 else
        f"f(a, b) != f(b, a) for {asymmetric} unordered pairs: operand order matters (first operand = "
        f"activation, second = weight)")
    # The other reading of the same bits: codes and 16-bit products as unsigned <-> two's complement.
    other_values = operand_values(not multiplier.signed)
    other_exact = other_values[:, None] * other_values[None, :]
    if multiplier.signed:
        other_table = approx & 0xFFFF
    else:
        other_table = np.where(approx > 32767, approx - 65536, approx)
    mae_declared = float(np.abs(error).mean())
    mae_other = float(np.abs(other_table - other_exact).mean())
    plausible = mae_declared <= mae_other
    kind = "signed" if multiplier.signed else "unsigned"
    other_kind = "unsigned" if multiplier.signed else "signed"
    add("signedness plausibility", plausible,
        f"treated as {kind}: MAE {mae_declared:.4g} vs the {kind} product; read as {other_kind} it "
        f"would be {mae_other:.4g}" + ("" if plausible else
                                       f" -- the table looks {other_kind}: check the declaration"))
    computed = metrics(multiplier)
    comparison = []
    for key in ("MAE%", "WCE%", "EP%", "MRE%", "MAE", "WCE", "MSE"):
        if key in multiplier.header_metrics_text:
            text = multiplier.header_metrics_text[key]
            ok = agrees_with_header(computed[key], text)
            comparison.append({"metric": key, "computed": computed[key], "header": text, "agrees": ok})
    for entry in comparison:
        if entry["metric"] in ("MAE%", "WCE%", "EP%"):
            add(f"header {entry['metric']} agrees", entry["agrees"],
                f"computed {entry['computed']:.6g}, header {entry['header']}")
    hardware = {k: v for k, v in multiplier.header_metrics.items() if k.startswith("PDK45")}
    return {
        "spec": multiplier.spec, "name": multiplier.name, "signed": multiplier.signed,
        "description": multiplier.description, "notes": list(multiplier.notes), "checks": checks,
        "metrics": computed, "header_comparison": comparison, "hardware": hardware,
        "passed": all(c["passed"] is not False for c in checks),
    }


def format_check_lines(checks: list[dict]) -> list[str]:
    """One line per check: [ok  ] / [FAIL] / [info], name, detail."""
    width = max((len(c["check"]) for c in checks), default=0)
    return [f"  [{ {True: 'ok  ', False: 'FAIL', None: 'info'}[c['passed']] }] "
            f"{c['check']:<{width}}  {c['detail']}" for c in checks]


def format_check(result: dict) -> str:
    """A readable report of check()'s result."""
    lines = [f"multiplier  {result['name']}  ({'signed' if result['signed'] else 'unsigned'})",
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
    lines.append("all checks passed" if result["passed"] else "some checks FAILED")
    return "\n".join(lines)

