"""`graphswap kernels check`: sanity, metrics and robustness checks of a kernel, run in a child
process so that a segfault, an abort or a hang in the user's code is reported as a failed check
(with the signal and the stage it happened in), not a dead command line.

What is checked, beyond graphswap.multipliers.check() for multipliers:
  - the kernel loads (compiles, evaluates its table) without crashing;
  - determinism: evaluating / calling it twice gives bit-identical results;
  - re-entrancy: calls from several threads at once equal sequential calls (graphswap calls kernels
    concurrently from TensorFlow's thread pools and tf.distribute replicas);
  - guard regions (operation-level libraries): the output buffer sits between guard zones filled
    with a sentinel, and the inputs are checksummed; any write outside the output, or to an
    input, fails the check;
  - NaN/Inf: how non-finite inputs come out (reported);
  - zero-size calls return success.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np

from graphswap import multipliers
from graphswap.errors import KernelSpecError
from graphswap.kernels.specs import parse_file_spec
from graphswap.native import conv_geometry
from graphswap.kernels.quantized import LutKernel
from graphswap.kernels.registry import evaluate_anew, resolve_kernel, resolve_multiplier

GUARD_FLOATS = 1024
SENTINEL = np.uint32(0x7FC0DEAD)  # a NaN payload no arithmetic produces by chance
STAGE_PREFIX = "GRAPHSWAP-CHECK-STAGE:"
RESULT_PREFIX = "GRAPHSWAP-CHECK-RESULT:"


# --------------------------------------------------------------------------------------------
# child side
# --------------------------------------------------------------------------------------------

def _stage(name: str) -> None:
    print(f"{STAGE_PREFIX}{name}", file=sys.stderr, flush=True)


def _guarded(shape) -> tuple[np.ndarray, np.ndarray]:
    """(whole buffer with guard zones, the output view in its middle)."""
    size = int(np.prod(shape))
    whole = np.empty(size + 2 * GUARD_FLOATS, dtype=np.float32)
    whole.view(np.uint32)[:] = SENTINEL
    return whole, whole[GUARD_FLOATS:GUARD_FLOATS + size].reshape(shape)


def _guards_intact(whole: np.ndarray) -> bool:
    bits = whole.view(np.uint32)
    return bool(np.all(bits[:GUARD_FLOATS] == SENTINEL) and np.all(bits[-GUARD_FLOATS:] == SENTINEL))


def _run_concurrently(functions) -> None:
    """Start every function on its own thread at once, and wait for all of them."""
    threads = [threading.Thread(target=function) for function in functions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _matmul_with_non_finite_rows(matmul) -> np.ndarray:
    """A (3,4) x (4,2) product whose first row holds a NaN and second row an +Inf."""
    a = np.ones((3, 4), np.float32)
    a[0, 1] = np.nan
    a[1, 2] = np.inf
    return matmul(a, np.ones((4, 2), np.float32))


def _library_checks(library, add) -> None:
    """Robustness checks of an operation-level library through its raw entry points."""
    rng = np.random.default_rng(0)
    shapes = [(1, 1, 1), (7, 13, 5), (33, 64, 17), (128, 96, 40)]
    guard_ok, inputs_ok, worst = True, True, 0.0
    outputs = {}
    _stage("matmul with guard regions")
    for m, k, n in shapes:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        a_copy, b_copy = a.copy(), b.copy()
        whole, c = _guarded((m, n))
        code = library.matmul_f32_into(a, b, c)
        if code != 0:
            add("matmul returns 0", False, f"returned {code} for ({m},{k})x({k},{n})")
            return
        guard_ok &= _guards_intact(whole)
        inputs_ok &= bool(np.array_equal(a, a_copy) and np.array_equal(b, b_copy))
        reference = a.astype(np.float64) @ b
        scale = np.abs(a.astype(np.float64)) @ np.abs(b)
        worst = max(worst, float(np.max(np.abs(c - reference) / np.maximum(scale, 1e-30))))
        outputs[(m, k, n)] = (a, b, c.copy())
    add("no writes outside the output (guard regions)", guard_ok,
        "guard zones intact for every shape" if guard_ok else
        "the kernel wrote outside its output buffer")
    add("inputs left unchanged", inputs_ok,
        "inputs unchanged" if inputs_ok else "the kernel modified an input buffer")
    add("matmul vs float64 product", None,
        f"max error relative to sum|a||b|: {worst:.3g} (float32 round-off is ~1e-7)")
    _stage("determinism")
    same = all(np.array_equal(library.matmul_f32(a, b), c) for a, b, c in outputs.values())
    add("deterministic (repeated calls)", same,
        "bit-identical" if same else "repeated calls with the same inputs differ")
    _stage("concurrent calls")
    results = {}

    def work(key):
        a, b, _ = outputs[key]
        results[key] = [library.matmul_f32(a, b) for _ in range(5)]

    _run_concurrently([lambda key=key: work(key) for key in outputs])
    reentrant = all(np.array_equal(r, outputs[key][2]) for key, rs in results.items() for r in rs)
    add("re-entrant (concurrent calls equal sequential)", reentrant,
        "equal" if reentrant else "concurrent calls gave different results: the kernel is not "
                                  "re-entrant (global state?)")
    _stage("zero-size call")
    try:
        empty = library.matmul_f32(np.zeros((0, 4), np.float32), np.zeros((4, 3), np.float32))
        add("zero-size batch", empty.shape == (0, 3), "returns success with an empty output")
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        add("zero-size batch", False, str(exc))
    _stage("NaN/Inf inputs")
    c = _matmul_with_non_finite_rows(library.matmul_f32)
    add("NaN/Inf inputs", None,
        f"row with NaN -> {'NaN' if np.isnan(c[0]).all() else c[0].tolist()}, row with +Inf -> "
        f"{'Inf' if np.isinf(c[1]).all() else c[1].tolist()}, finite row finite: "
        f"{bool(np.isfinite(c[2]).all())}")
    if library.has_conv2d:
        _stage("conv2d with guard regions")
        x = rng.standard_normal((2, 9, 8, 3)).astype(np.float32)
        w = rng.standard_normal((3, 3, 3, 5)).astype(np.float32)
        g = conv_geometry(x.shape, w.shape, (2, 1), (1, 1), "same")
        whole, out = _guarded(g.output_shape)
        code = library.conv2d_f32_into(x, w, out, g)
        ok = code == 0 and _guards_intact(whole)
        add("conv2d: no writes outside the output", ok,
            "guard zones intact" if ok else f"returned {code} or wrote outside its output")


def _multiplier_checks(spec, add) -> dict:
    _stage("evaluating the multiplier table")
    multiplier = resolve_multiplier(spec)
    table = multiplier.table.copy()
    _stage("sanity checks and metrics")
    result = multipliers.check(multiplier)
    if multiplier.kind in ("c", "so"):
        _stage("determinism")
        again = evaluate_anew(spec).table
        add("deterministic (table evaluated twice)", bool(np.array_equal(again, table)),
            "bit-identical" if np.array_equal(again, table) else
            "a second evaluation gave a different table: the function has state or is random")
        _stage("concurrent evaluation")
        tables = []
        _run_concurrently([lambda: tables.append(evaluate_anew(spec).table)] * 4)
        same = len(tables) == 4 and all(np.array_equal(t, table) for t in tables)
        add("re-entrant (concurrent evaluation)", same,
            "equal" if same else "concurrent evaluations differ: the function is not re-entrant")
    _stage("NaN/Inf inputs through the quantized kernel")
    c = _matmul_with_non_finite_rows(LutKernel(multiplier).matmul)
    add("NaN/Inf inputs", None,
        f"outputs depending on a NaN/Inf input are NaN: {bool(np.isnan(c[:2]).all())}; "
        f"others finite: {bool(np.isfinite(c[2]).all())}")
    return result


def child_main(spec: str, plot: str | None) -> int:
    extra: list[dict] = []

    def add(name, passed, detail):
        extra.append({"check": name, "passed": passed, "detail": detail})

    _stage("resolving the kernel")
    multiplier = resolve_multiplier(spec)
    if multiplier is not None:
        result = _multiplier_checks(spec, add)
        if plot:
            _stage("plotting")
            multipliers.plot_error_heatmap(multiplier, plot)
            result["plot"] = plot
    else:
        kernel = resolve_kernel(spec)
        library = getattr(kernel, "library", None)
        result = {"spec": kernel.spec, "name": kernel.spec, "description": kernel.description,
                  "kind": "operation-level", "checks": []}
        if library is None:
            add("checks", None, f"{kernel.spec} is a float-level built-in; nothing to isolate")
        else:
            _library_checks(library, add)
        if plot:
            add("plot", None, "--plot applies to multipliers only; no heat map written")
    result["checks"] = list(result.get("checks", [])) + extra
    result["passed"] = all(c["passed"] is not False for c in result["checks"])
    print(RESULT_PREFIX + json.dumps(result, default=float), flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------------------------

def _failure(spec: str, stage: str, detail: str) -> dict:
    return {"spec": spec, "name": spec, "description": "", "crashed": True,
            "checks": [{"check": f"runs without crashing (stage: {stage})", "passed": False,
                        "detail": detail}],
            "passed": False}


def check_kernel(spec: str, plot: str | None = None, timeout: float = 120.0) -> dict:
    """Run all checks of `spec` in a child process; a crash or hang becomes a failed check.

    A spec that names no file is resolved here first (a built-in runs only graphswap's own
    code), so a typo or a missing file is one clear KernelSpecError, not a table of failures."""
    file_spec = parse_file_spec(spec.strip())
    if file_spec is None:
        resolve_kernel(spec)
    elif not os.path.isfile(file_spec.path):
        raise KernelSpecError(f"{file_spec.what} not found: {file_spec.path} (resolved to "
                              f"{os.path.abspath(file_spec.path)}); check the path")

    # the directory holding the graphswap package (graphswap/kernels/check.py -> three up)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    command = [sys.executable, "-m", "graphswap.kernels.check", spec]
    if plot:
        command += ["--plot", os.path.abspath(plot)]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                   env=env)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return _failure(spec, _last_stage(stderr),
                        f"no answer within {timeout:g} s: the kernel hangs (killed)")
    stage = _last_stage(completed.stderr)
    for line in completed.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    if completed.returncode < 0:
        number = -completed.returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return _failure(spec, stage, f"the kernel crashed the checking process with {name} "
                                     f"({number})")
    message = _last_error_line(completed.stderr)
    return _failure(spec, stage, message or f"the checking process exited with code "
                                            f"{completed.returncode}")


def _last_stage(stderr: str) -> str:
    stages = [line[len(STAGE_PREFIX):] for line in (stderr or "").splitlines()
              if line.startswith(STAGE_PREFIX)]
    return stages[-1] if stages else "starting"


def _last_error_line(stderr: str) -> str:
    lines = [line for line in (stderr or "").splitlines()
             if line.strip() and not line.startswith(STAGE_PREFIX)]
    for line in reversed(lines):
        if "Error" in line:
            return line.strip()
    return lines[-1].strip() if lines else ""


def format_result(result: dict) -> str:
    """Readable report: the multiplier report when there is one, else the checks list."""
    if "metrics" in result:
        return multipliers.format_check(result)
    lines = [f"kernel      {result.get('name', result['spec'])}"]
    if result.get("description"):
        lines.append(f"            {result['description']}")
    lines.append("")
    lines.extend(multipliers.format_check_lines(result["checks"]))
    lines.append("")
    lines.append("all checks passed" if result["passed"] else "some checks FAILED")
    return "\n".join(lines)


def _main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="child process of `graphswap kernels check`")
    parser.add_argument("spec")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    try:
        return child_main(args.spec, args.plot)
    except Exception as exc:  # noqa: BLE001 - the parent turns this into a failed check
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(_main())
