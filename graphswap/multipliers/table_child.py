"""Evaluating a user's multiplier: the code that calls it, 256 x 256 times, through ctypes.

It runs in two places:
  - as a script, in a child process (`python -I -S table_child.py PLAN_JSON`), which is how
    graphswap evaluates every multiplier file (graphswap.multipliers.isolation): a crash or a hang
    in the user's code kills or stalls that child only;
  - in-process, for `graphswap kernels check`'s determinism and re-entrancy checks (the check
    already runs in a child process of its own).

So this module imports nothing but the standard library (the child starts without site-packages,
in milliseconds).  The plan names a private copy in the owner-only cache and the SHA-256 it must
have; the file is opened once (no symbolic link followed), its bytes are hashed through that
descriptor, and the library is loaded through the same descriptor.

Output protocol of the script (stdout, binary; what the user's code prints goes to stderr): b"L" once the library is loaded and the function
found, then for each evaluated row of the table 256 raw results as uint64 little-endian (2 KiB),
in the plan's row order.  The raw result is the function's return value at its declared width,
zero-extended (unsigned return types) or sign-extended (signed ones) to 64 bits.  Failures before
the first row: one JSON line on stderr ({"error": "hash" | "load" | "symbol", "message": ...}) and
exit code 3.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import stat
import struct
import sys

ROW = 256
ROW_FORMAT = "<256Q"
LOADED = b"L"
MASK64 = (1 << 64) - 1

#: ctypes types by the names plans use
CTYPES = {"u8": ctypes.c_uint8, "s8": ctypes.c_int8, "u16": ctypes.c_uint16,
          "s16": ctypes.c_int16, "u64": ctypes.c_uint64}


class PlanError(Exception):
    """The library could not be used: wrong hash, not loadable, symbol missing (`kind`)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


#: descriptors the libraries were loaded through, open for the process (the dynamic loader
#: knows a loaded object by its /proc/self/fd/N name: the number must not be reused)
_loaded_through: list = []


def _open_hashed(path: str):
    """(descriptor, SHA-256 of the bytes read from it): the file opened once, no symbolic link
    followed, a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PlanError("hash", f"{path} is not a regular file")
        digest = hashlib.sha256()
        for block in iter(lambda: os.read(fd, 1 << 20), b""):
            digest.update(block)
    except BaseException:
        os.close(fd)
        raise
    return fd, digest.hexdigest()


def open_plan(plan: dict):
    """The callable that fills one row: row(x) -> list of 256 raw uint64 results.

    The library is loaded through the descriptor whose bytes were hashed (/proc/self/fd/N), so
    what runs is exactly what matched the plan's SHA-256."""
    path = plan["library"]
    try:
        fd, digest = _open_hashed(path)
    except OSError as exc:
        raise PlanError("hash", f"{path} cannot be opened as a regular file: {exc}") from None
    if digest != plan["sha256"]:
        os.close(fd)
        raise PlanError("hash", f"{path} does not have the SHA-256 graphswap checked")
    through = f"/proc/self/fd/{fd}"
    _loaded_through.append(fd)  # never closed: the loader knows the library by that name
    try:
        library = ctypes.CDLL(through if os.path.exists(through) else path)
    except OSError as exc:
        raise PlanError("load", str(exc).replace(through, path)) from None
    if plan["mode"] == "wrapper":
        try:
            fill = library.graphswap_fill_multiplier_row
        except AttributeError:
            raise PlanError("symbol", "graphswap_fill_multiplier_row") from None
        fill.restype = None
        fill.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_uint64)]

        def row(x):
            values = (ctypes.c_uint64 * ROW)()
            fill(x, values)
            return list(values)

        return row
    try:
        function = getattr(library, plan["symbol"])
    except AttributeError:
        raise PlanError("symbol", plan["symbol"]) from None
    arg_type = CTYPES[plan["arg"]]
    function.argtypes = [arg_type, arg_type]
    function.restype = CTYPES[plan["ret"]]
    signed_args = arg_type is ctypes.c_int8
    swap = plan["order"] == "ba"
    operands = [(code - 256 if code > 127 else code) if signed_args else code
                for code in range(ROW)]

    def row(x):
        first = operands[x]
        if swap:
            return [function(second, first) & MASK64 for second in operands]
        return [function(first, second) & MASK64 for second in operands]

    return row


def rows_in_order(plan: dict, order) -> dict:
    """Evaluate the rows in `order` in this process: {x: [256 raw results]}."""
    row = open_plan(plan)
    return {x: row(x) for x in order}


def _main(argv) -> int:
    plan = json.loads(argv[1])
    # The rows go out on the original stdout; the user's code printing (a debugging printf) goes
    # to stderr instead, so it cannot corrupt them.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        row = open_plan(plan)
    except PlanError as exc:
        sys.stderr.write(json.dumps({"error": exc.kind, "message": str(exc)}) + "\n")
        return 3
    out.write(LOADED)
    out.flush()
    for x in plan.get("rows", range(ROW)):
        out.write(struct.pack(ROW_FORMAT, *row(x)))
        out.flush()  # rows already written tell the parent where a crash happened
    return 0


def _die_with_parent() -> None:
    """Linux: be killed when the process that started us dies (a killed `kernels check`)."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    _die_with_parent()
    sys.exit(_main(sys.argv))
