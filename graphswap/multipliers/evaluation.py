"""Evaluating a multiplier file into its table: in a child process, with range checks.

A user's multiplier (a `.c` compiled with graphswap's wrapper, or a `lib.so:symbol`) is native
code.  `evaluate_isolated` runs it in a child process (graphswap/multipliers/table_child.py, which
loads the same private, hash-checked copy from the owner-only cache) and reads the results back
over a pipe, row by row; a crash becomes KernelCrashError naming the signal and the stage (which
operand row), a hang is killed after a timeout.  `evaluate_in_process` is the same evaluation in
the calling process, for `graphswap kernels check`'s determinism and re-entrancy checks (which run
in a child process of their own).

Both return the raw results: each return value at its declared C width, as uint64 bits.
`table_from_raw` turns them into the table and refuses results that are not 8x8-bit products:
unsigned multipliers must return 0..65535, signed ones -32768..32767 (or, declared with unsigned
types, a 16-bit two's-complement pattern).  A 64-bit result of 2**64 - 5 is out of range, not -5:
a table that does not hold the function's real products is a wrong model of the hardware.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import numpy as np

from graphswap.errors import (KernelCrashError, KernelSpecError, KernelTrustError,
                              MultiplierRangeError)
from graphswap.multipliers import table_child
from graphswap.multipliers.record import TABLE_SIZE
from graphswap.native.sandbox import isolated_environment, isolated_workdir

CHILD_SCRIPT = os.path.abspath(table_child.__file__)
#: seconds a multiplier may take to fill its table before it is taken to hang
EVALUATION_TIMEOUT = 120.0
ROW_BYTES = table_child.ROW * 8


@dataclasses.dataclass(frozen=True)
class EvaluationPlan:
    """How to evaluate one multiplier: the private copy to load and how to call it."""

    source: str            # the user's file, for messages
    name: str              # the function, for messages
    library: str           # private copy in the owner-only cache
    sha256: str            # what that copy must hash to
    mode: str              # "wrapper" (graphswap's generated row filler) or "symbol" (ctypes)
    symbol: str | None = None
    arg: str | None = None  # table_child.CTYPES names, "symbol" mode only
    ret: str | None = None
    order: str = "ab"

    def to_json(self, rows=None) -> str:
        plan = {"library": self.library, "sha256": self.sha256, "mode": self.mode,
                "symbol": self.symbol, "arg": self.arg, "ret": self.ret, "order": self.order}
        if rows is not None:
            plan["rows"] = list(rows)
        return json.dumps(plan)


@dataclasses.dataclass(frozen=True)
class ResultType:
    """The declared C return type and the multiplier's signedness."""

    bits: int
    type_signed: bool
    multiplier_signed: bool
    c_name: str

    @property
    def twos_pattern(self) -> bool:
        """A signed product delivered as a 16-bit pattern (int16 or narrower, or unsigned types:
        EvoApproxLib's mis-declared signed files)."""
        return self.multiplier_signed and (self.bits <= 16 or not self.type_signed)


def _operand(code: int, signed: bool) -> int:
    return code - 256 if signed and code > 127 else code


def _plan_error(plan: EvaluationPlan, kind: str, message: str) -> Exception:
    if kind == "hash":
        return KernelTrustError(f"{plan.source}: the private copy {plan.library} changed after "
                                f"it was checked; nothing was loaded. Run the command again")
    if kind == "symbol" and plan.mode == "symbol":
        return KernelSpecError(
            f"symbol {plan.symbol!r} not found in {plan.source}; check the exported names with "
            f"'nm -D {plan.source}' (a function compiled with -fvisibility=hidden or declared "
            f"static is not exported)")
    if plan.mode == "symbol":
        return KernelSpecError(f"cannot load {plan.source}: {message}; it must be a shared library "
                               f"built for this machine (cc -O2 -shared -fPIC mul.c -o libmul.so)")
    return KernelSpecError(f"cannot load the compiled multiplier {plan.source}: {message}; the "
                           f"source compiles, but the library does not load (an undefined "
                           f"function?)")


def evaluate_in_process(plan: EvaluationPlan, row_order=None) -> np.ndarray:
    """The raw results (uint64[65536], index (a_code << 8) | b_code) evaluated in this process,
    rows in `row_order` (default 0..255)."""
    order = list(range(table_child.ROW)) if row_order is None else list(row_order)
    try:
        rows = table_child.rows_in_order(json.loads(plan.to_json()), order)
    except table_child.PlanError as exc:
        raise _plan_error(plan, exc.kind, str(exc)) from None
    raw = np.empty(TABLE_SIZE, dtype=np.uint64)
    for x, values in rows.items():
        raw[x << 8:(x + 1) << 8] = values
    return raw


def evaluate_isolated(plan: EvaluationPlan, signed: bool,
                      timeout: float | None = None) -> np.ndarray:
    """The raw results evaluated in a child process (see the module docstring); raises
    KernelCrashError when the multiplier crashes there, or hangs past `timeout` seconds
    (default EVALUATION_TIMEOUT)."""
    with isolated_workdir() as workdir:
        body = run_row_child([sys.executable, "-I", "-S", CHILD_SCRIPT, plan.to_json()], plan,
                             signed, table_child.ROW, workdir, isolated_environment(), timeout)
    return np.frombuffer(body, dtype="<u8").astype(np.uint64)


def run_row_child(command: list, plan: EvaluationPlan, signed: bool, rows: int, cwd: str,
                  env: dict, timeout: float | None = None, refusal=None) -> bytes:
    """The rows (`rows` of them, raw little-endian uint64) a child process that writes
    table_child's protocol sends back: LOADED, then the rows.  A crash, a hang past `timeout`
    seconds, or a refusal before loading becomes the error naming the multiplier and the stage;
    `refusal(report)` turns the child's JSON report of a refusal into the error to raise (else
    the plan's own kinds: hash, symbol, load)."""
    timeout = EVALUATION_TIMEOUT if timeout is None else timeout
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd=cwd, env=env)
    hung = False
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        hung = True
    loaded = stdout[:1] == table_child.LOADED
    body = stdout[1:] if loaded else b""
    done = len(body) // ROW_BYTES
    text = stderr.decode("utf-8", "replace")
    if not hung and process.returncode == 3 and not loaded and refusal is not None:
        report = _report(text)
        if report is not None:
            raise refusal(report)
    if hung or process.returncode != 0 or done != rows:
        raise _failure(plan, signed, process.returncode, hung, loaded, min(done, table_child.ROW),
                       timeout, text)
    return body


def _report(stderr: str) -> dict | None:
    """The child's JSON report of why it stopped before loading (its last line), if any."""
    try:
        report = json.loads(stderr.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return report if isinstance(report, dict) and "error" in report else None


def _failure(plan, signed, code, hung, loaded, done, timeout, stderr) -> Exception:
    if not hung and code == 3 and not loaded:
        try:
            report = json.loads(stderr.strip().splitlines()[-1])
            return _plan_error(plan, report["error"], report["message"])
        except (ValueError, KeyError, IndexError):
            pass
    if loaded and done < table_child.ROW:
        stage = (f"evaluating its table (first operand {_operand(done, signed)}; {done} of 256 "
                 f"rows done)")
    else:
        stage = "loading the library (its initialisation code)"
    check = f"'graphswap kernels check {plan.source}' reports more"
    if hung:
        return KernelCrashError(
            f"{plan.source}: the multiplier {plan.name} did not finish within {timeout:g} s "
            f"while {stage}: it hangs (the evaluating process was killed); {check}")
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return KernelCrashError(
            f"{plan.source}: the multiplier {plan.name} crashed with {name} ({-code}) while "
            f"{stage}; graphswap evaluates multiplier files in a child process, so nothing else "
            f"was affected. Fix the function; {check}")
    last = [line for line in stderr.splitlines() if line.strip()][-1:] or [""]
    return KernelCrashError(
        f"{plan.source}: evaluating the multiplier {plan.name} failed (exit code {code}) while "
        f"{stage}{': ' + last[0].strip() if last[0] else ''}; {check}")


def table_from_raw(raw: np.ndarray, result: ResultType, where: str, name: str) -> np.ndarray:
    """The int32 table of raw results (see the module docstring), refusing results that are not
    products of two 8-bit operands: MultiplierRangeError names the operands."""
    raw = np.asarray(raw, dtype=np.uint64)
    as_signed = raw.view(np.int64)
    values = as_signed if result.type_signed else raw
    if result.twos_pattern:
        if result.bits <= 16:
            ok = np.ones(raw.shape, dtype=bool)
        else:  # wider unsigned: a 16-bit pattern, or one sign-extended to the declared width
            ok = (raw < 2 ** 16) | (raw >= 2 ** result.bits - 2 ** 15)
        table = (raw & np.uint64(0xFFFF)).astype(np.uint16).view(np.int16).astype(np.int64)
        allowed = ("a 16-bit two's-complement pattern (0..65535, or -32768..-1 sign-extended to "
                   f"{result.bits} bits)")
    elif result.multiplier_signed:  # a signed type wider than 16 bits (unsigned ones: above)
        ok = (as_signed >= -32768) & (as_signed <= 32767)
        table = as_signed
        allowed = "-32768..32767 (a signed 8x8-bit product fits int16)"
    else:
        ok = (as_signed >= 0) & (raw <= 65535) if result.type_signed else raw <= 65535
        table = as_signed
        allowed = "0..65535 (an unsigned 8x8-bit product fits 16 bits)"
    bad = np.flatnonzero(~ok)
    if bad.size:
        raise MultiplierRangeError(_range_message(where, name, result, values, bad, allowed))
    return table.astype(np.int32)


def _range_message(where, name, result, values, bad, allowed) -> str:
    signed = result.multiplier_signed
    shown = []
    for index in bad[:3]:
        a, b = _operand(int(index) >> 8, signed), _operand(int(index) & 255, signed)
        value = int(values[index])
        text = f"{name}({a}, {b}) = {value}"
        if not result.type_signed and result.bits == 64 and value >= 2 ** 63:
            text += f" (2**64 - {2 ** 64 - value}; {value - 2 ** 64} if read as int64)"
        shown.append(text)
    more = f", ... ({bad.size} of 65536 operand pairs)" if bad.size > 3 else \
        f" ({bad.size} of 65536 operand pairs)"
    return (f"{where}: the multiplier returns values outside {allowed}, declared {result.c_name}: "
            f"{'; '.join(shown)}{more}. graphswap refuses it rather than store a table that does "
            f"not hold the function's real products (truncating them would model other hardware); "
            f"fix the function or its declared return type")
