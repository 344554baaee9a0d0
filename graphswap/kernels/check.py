"""`graphswap kernels check`: sanity, metrics and robustness checks of a kernel, run in a child
process so that a segfault, an abort or a hang in the user's code is reported as a failed check
(with the signal and the stage it happened in), not a dead command line.

What is checked, beyond graphswap.multipliers.check() for multipliers:
  - the kernel loads (compiles, evaluates its table) without crashing, its results are 8x8-bit
    products at their declared width (graphswap.multipliers.evaluation);
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
import time

import numpy as np

from graphswap import multipliers
from graphswap.errors import GraphswapError, KernelCrashError, KernelSpecError, MultiplierRangeError
from graphswap.kernels.fp8 import parse_fp8_spec
from graphswap.kernels.fp8_check import check_fp8
from graphswap.kernels.specs import parse_file_spec
from graphswap.native import conv_geometry
from graphswap.native.sandbox import isolated_environment, isolated_workdir
from graphswap.kernels.quantized import LutKernel
from graphswap.kernels.registry import (evaluate_passes, file_not_found_message, resolve_kernel,
                                        resolve_multiplier)

GUARD_FLOATS = 1024
SENTINEL = np.uint32(0x7FC0DEAD)  # a NaN payload no arithmetic produces by chance
STAGE_PREFIX = "GRAPHSWAP-CHECK-STAGE:"
RESULT_PREFIX = "GRAPHSWAP-CHECK-RESULT:"
#: re-entrancy: threads calling at once, least rounds, and the time budget of the whole check
REENTRANCY_THREADS = 4
REENTRANCY_MIN_ROUNDS = 8
REENTRANCY_BUDGET_S = 2.0
#: a call shorter than this is made longer (more rows) so concurrent calls overlap in time
REENTRANCY_MIN_CALL_S = 0.002


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
    """Run every function on its own thread, released together by a barrier; wait for all."""
    barrier = threading.Barrier(len(functions))

    def released(function):
        barrier.wait()
        function()

    threads = [threading.Thread(target=released, args=(function,)) for function in functions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def reentrancy_check(call, make_inputs, threads: int = REENTRANCY_THREADS,
                     min_rounds: int = REENTRANCY_MIN_ROUNDS,
                     budget_s: float = REENTRANCY_BUDGET_S) -> tuple[bool, str]:
    """Is `call(*inputs)` re-entrant?  Every thread gets inputs of the same shape but its own
    values (`make_inputs(thread, rows)`), so calls that share state - a static scratch buffer, a
    global accumulator - mix the threads' results; each concurrent result is compared bit for bit
    with the same call made alone.  Rounds repeat (at least `min_rounds`, then until `budget_s`)
    and stop at the first difference.  Returns (passed, detail)."""
    rows = 16
    while True:  # make one call long enough that concurrent calls overlap in time
        probe = make_inputs(0, rows)
        started = time.perf_counter()
        call(*probe)
        if time.perf_counter() - started >= REENTRANCY_MIN_CALL_S or rows >= 8192:
            break
        rows *= 4
    inputs = [make_inputs(thread, rows) for thread in range(threads)]
    reference = [call(*args) for args in inputs]
    first_shape = tuple(np.shape(inputs[0][0]))
    wrong: list[tuple[int, int]] = []
    rounds = 0
    started = time.monotonic()
    while not wrong and (rounds < min_rounds or time.monotonic() - started < budget_s):
        results = [None] * threads

        def work(thread):
            results[thread] = call(*inputs[thread])

        _run_concurrently([lambda thread=thread: work(thread) for thread in range(threads)])
        rounds += 1
        wrong = [(rounds, thread) for thread in range(threads)
                 if not np.array_equal(results[thread], reference[thread], equal_nan=True)]
    if wrong:
        return False, (f"{len(wrong)} of {threads} concurrent calls (input {first_shape}, round "
                       f"{wrong[0][0]}) differ from the same call made alone: the kernel is not "
                       f"re-entrant (a shared scratch buffer or other global state?); allocate "
                       f"per call or use thread-local storage")
    return True, (f"{rounds} rounds of {threads} concurrent calls on input {first_shape}, each "
                  f"with its own values: all equal the sequential results bit for bit")


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
    if not (guard_ok and inputs_ok):
        add("further checks", None, "skipped: the kernel writes outside its output, so calling "
                                    "it again could corrupt the checking process's memory")
        return
    _stage("determinism")
    same = all(np.array_equal(library.matmul_f32(a, b), c) for a, b, c in outputs.values())
    add("deterministic (repeated calls)", same,
        "bit-identical" if same else "repeated calls with the same inputs differ")
    _stage("concurrent calls")

    def matmul_inputs(thread, rows):
        local = np.random.default_rng(100 + thread)
        return (local.standard_normal((rows, 96)).astype(np.float32),
                local.standard_normal((96, 40)).astype(np.float32))

    reentrant, detail = reentrancy_check(library.matmul_f32, matmul_inputs)
    add("re-entrant (concurrent calls equal sequential)", reentrant, detail)
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
        if ok:
            _stage("concurrent conv2d calls")

            def conv_inputs(thread, rows):
                local = np.random.default_rng(200 + thread)
                return (local.standard_normal((max(1, rows // 16), 9, 8, 3)).astype(np.float32),
                        local.standard_normal((3, 3, 3, 5)).astype(np.float32))

            def conv(x, w):
                return library.conv2d_f32(x, w, conv_geometry(x.shape, w.shape, (2, 1), (1, 1),
                                                              "same"))

            reentrant, detail = reentrancy_check(conv, conv_inputs)
            add("conv2d: re-entrant (concurrent calls equal sequential)", reentrant, detail)


def _multiplier_checks(spec, multiplier, add) -> dict:
    table = multiplier.table.copy()
    _stage("sanity checks and metrics")
    result = multipliers.check(multiplier)
    if multiplier.kind in ("c", "so"):
        width = getattr(multiplier, "width", "8x8")
        bits = sum(int(part) for part in width.split("x"))
        add(f"results are {width}-bit products", True,
            f"every result fits the {bits}-bit range of its signedness at its declared width")
        # The table above came from a fresh process; these evaluations run in one process of
        # their own (the sandbox's for a C source), three passes one after the other, so state
        # the function keeps between calls shows up as a difference, then four threads at once,
        # each at other operands than the others at any moment.
        _stage("determinism and concurrent evaluation")
        every_row = list(range(256))
        orders = [[(start + i) % 256 for i in range(256)] for start in (0, 64, 128, 192)]
        tables = [m.table for m in evaluate_passes(spec, [every_row] * 2, orders)]
        same = all(np.array_equal(t, table) for t in tables[:2])
        add("deterministic (table evaluated three times)", same,
            "bit-identical" if same else
            "evaluations of the same operands gave different tables: the function has state or "
            "is random")
        same = len(tables) == 6 and all(np.array_equal(t, table) for t in tables[2:])
        add("re-entrant (concurrent evaluation)", same,
            "equal" if same else "concurrent evaluations differ: the function is not re-entrant")
    _stage("NaN/Inf inputs through the quantized kernel")
    _report_non_finite(LutKernel(multiplier).matmul, add)
    return result


def _report_non_finite(matmul, add) -> None:
    c = _matmul_with_non_finite_rows(matmul)
    add("NaN/Inf inputs", None,
        f"outputs depending on a NaN/Inf input are NaN: {bool(np.isnan(c[:2]).all())}; "
        f"others finite: {bool(np.isfinite(c[2]).all())}")


def failed_result(spec: str, check: str, detail: str, **extra) -> dict:
    """A check result with one failed check (a kernel that cannot be checked further)."""
    return {"spec": spec, "name": spec, "description": "", **extra,
            "checks": [multipliers.check_entry(check, False, detail)], "passed": False}


def _emit(result: dict) -> int:
    print(RESULT_PREFIX + json.dumps(result, default=float), flush=True)
    return 0


def child_main(spec: str, plot: str | None) -> int:
    extra: list[dict] = []

    def add(name, passed, detail):
        extra.append(multipliers.check_entry(name, passed, detail))

    if parse_fp8_spec(spec) is not None:   # an 8-bit float multiplier: graphswap/kernels/fp8_check
        result, kernel = check_fp8(spec, add, _stage)
        if kernel is not None:
            _stage("NaN/Inf inputs through the FP8 kernel")
            _report_non_finite(kernel.matmul, add)
        if plot:
            add("plot", None, "--plot draws integer multipliers' error maps; no heat map written")
        result["checks"] = extra
        result["passed"] = all(c["passed"] is not False for c in extra)
        return _emit(result)
    _stage("evaluating the multiplier table")
    try:
        multiplier = resolve_multiplier(spec)
    except MultiplierRangeError as exc:
        return _emit(failed_result(spec, "results are 8x8-bit products", str(exc)))
    except KernelCrashError as exc:
        return _emit(failed_result(spec, "runs without crashing (stage: evaluating the "
                                         "multiplier table)", str(exc), crashed=True))
    except GraphswapError as exc:  # compile errors keep the compiler's whole output
        return _emit(failed_result(spec, "loads (compiles, links, evaluates)", str(exc)))
    if multiplier is not None:
        result = _multiplier_checks(spec, multiplier, add)
        if plot:
            _stage("plotting")
            multipliers.plot_error_heatmap(multiplier, plot)
            result["plot"] = plot
    else:
        _stage("resolving the kernel")
        try:
            kernel = resolve_kernel(spec)
        except GraphswapError as exc:
            return _emit(failed_result(spec, "loads", str(exc)))
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
    return _emit(result)


# --------------------------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------------------------

def _failure(spec: str, stage: str, detail: str) -> dict:
    return failed_result(spec, f"runs without crashing (stage: {stage})", detail, crashed=True)


def check_kernel(spec: str, plot: str | None = None, timeout: float = 120.0) -> dict:
    """Run all checks of `spec` in a child process; a crash or hang becomes a failed check.

    A spec that names no file is resolved here first (a built-in runs only graphswap's own
    code), so a typo or a missing file is one clear KernelSpecError, not a table of failures."""
    fp8_spec = parse_fp8_spec(spec.strip())
    file_spec = None if fp8_spec is not None else parse_file_spec(spec.strip())
    if fp8_spec is not None:
        if fp8_spec.kind is not None and not os.path.isfile(fp8_spec.path):
            raise KernelSpecError(f"{fp8_spec.what} not found: {fp8_spec.path} (resolved to "
                                  f"{os.path.abspath(fp8_spec.path)}); check the path")
    elif file_spec is None:
        resolve_kernel(spec)
    elif not os.path.isfile(file_spec.path):
        raise KernelSpecError(file_not_found_message(file_spec, os.path.abspath(file_spec.path)))

    # The child runs isolated: `python -I` in a private folder, a clean environment; the package
    # it imports is this one, the spec's file path absolute.
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    command = [sys.executable, "-I", "-c", _CHILD_BOOTSTRAP, package_root,
               _absolute_spec(spec, fp8_spec or file_spec)]
    if plot:
        command += ["--plot", os.path.abspath(plot)]
    with isolated_workdir("graphswap-check-") as workdir:
        # its own session: a timeout kills the whole group (a multiplier's evaluating child too)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=workdir, start_new_session=True,
                                   env=isolated_environment(TF_CPP_MIN_LOG_LEVEL="3"))
        return _answer(process, spec, timeout)


#: the isolated child: the package from the folder the parent names (argv: -c, folder, spec...)
_CHILD_BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
                    "from graphswap.kernels.check import _main; sys.exit(_main(sys.argv[1:]))")


def _absolute_spec(spec: str, parsed) -> str:
    """`spec` with its file path made absolute (the child runs in a folder of its own)."""
    path = getattr(parsed, "path", None)
    spec = spec.strip()
    if not path or os.path.isabs(path) or path not in spec:
        return spec
    return spec.replace(path, os.path.abspath(path), 1)


def _answer(process, spec: str, timeout: float) -> dict:
    """The check result the child printed, or a failed check naming its crash or hang."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = process.communicate()
        return _failure(spec, _last_stage(stderr),
                        f"no answer within {timeout:g} s: the kernel hangs (killed)")
    completed = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
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
    lines.append(multipliers.verdict(result))
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
        return _emit(failed_result(args.spec, "runs without errors", f"{type(exc).__name__}: "
                                                                     f"{exc}"))


if __name__ == "__main__":
    sys.exit(_main())
