"""The sandboxed process that turns a user's C multiplier into its table: it confines itself with
Landlock, compiles graphswap's wrapper around a private copy of the approved source, loads the
result and writes the raw table rows to its standard output.  Only the rows leave it, as data.

Started by graphswap.native.sandbox as `python -I -S sandbox_child.py PLAN_JSON`, in its private
folder, with a clean environment: it imports nothing from the user's folders and nothing of
graphswap (the standard library, and landlockpy from the folder the plan names).

What the confined process may do (everything else is refused by the kernel):
  read and execute   the system folders (/usr, /lib*, /bin, /sbin) and the compiler's own prefix
  read               /etc (the loader's cache), /dev/null, /proc/self
  read and write     its private folder (the source copy, the wrapper, the compiler's temporaries)
  no TCP bind or connect (Landlock ABI >= 4), no signals or abstract sockets to processes outside
  the sandbox (ABI >= 6)
So whatever the source makes the preprocessor, the assembler (.include / .incbin, section names)
or the linker read can only be a system file or the approved copy itself.

Protocol (stdout, binary): b"L" once the library is loaded, then each pass's rows (256 raw
uint64 results a row, little-endian), in the pass's row order; concurrent passes follow the
sequential ones.  On a failure before loading: exit code 3 and one JSON line on stderr,
{"error": kind, "message": ..., "read": [...]} with kind "sandbox", "hash", "header", "compile",
"load" or "symbol".
"""

import ctypes
import hashlib
import json
import os
import struct
import subprocess
import sys
import threading

ROW = 256
ROW_FORMAT = "<256Q"
LOADED = b"L"
FAILED = 3


class Failure(Exception):
    def __init__(self, kind, message, read=()):
        super().__init__(message)
        self.kind, self.read = kind, list(read)


def _confine(plan):
    """Landlock: the process and everything it starts may touch only what the plan lists."""
    if not plan["sandbox"]:
        return
    sys.path.insert(0, plan["landlockpy_dir"])
    try:
        import landlockpy
        from landlockpy import AccessFS, Scope
    except ImportError as exc:
        raise Failure("sandbox", f"the landlockpy package cannot be imported ({exc})") from None
    abi = landlockpy.abi_version()
    if abi < 1:
        raise Failure("sandbox", "this kernel offers no Landlock sandbox")
    read = AccessFS.READ_FILE | AccessFS.READ_DIR
    everything = landlockpy.fs_for_abi(abi)
    scopes = landlockpy.scope_for_abi(abi)
    with landlockpy.Ruleset(handled_fs=everything, handled_net=landlockpy.net_for_abi(abi),
                            scoped=scopes & (Scope.ABSTRACT_UNIX_SOCKET | Scope.SIGNAL)) as rules:
        for folder in plan["read_execute"]:
            rules.allow_path(folder, read | AccessFS.EXECUTE)
        for path in plan["read_only"]:
            if os.path.isdir(path):
                rules.allow_path(path, read)
            elif os.path.exists(path):   # a file takes only file rights
                rules.allow_path(path, AccessFS.READ_FILE)
        rules.allow_path("/dev/null", AccessFS.READ_FILE | AccessFS.WRITE_FILE)
        rules.allow_path(plan["workdir"], everything)
        # no port rule: every handled TCP right stays denied
        rules.restrict()


def _check_copy(plan):
    with open(plan["source_copy"], "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    if digest != plan["sha256"]:
        raise Failure("hash", f"the private copy {plan['source_copy']} changed after it was "
                              f"checked")


def _run(command, plan, what):
    result = subprocess.run(command, capture_output=True, text=True, cwd=plan["workdir"],
                            env=plan["compiler_env"], timeout=600)
    if result.returncode != 0:
        output = result.stderr.strip() or result.stdout.strip()
        raise Failure("compile", f"{what} failed (exit {result.returncode}):\n{output}")
    return result


def _rule_files(text):
    """The files of a make rule written by `cc -M` (escaped blanks and '$$' unescaped)."""
    _, _, rest = text.replace("\\\n", " ").partition(":")
    files, current, index = [], [], 0
    while index < len(rest):
        char = rest[index]
        if char == "\\" and rest[index + 1:index + 2] in (" ", "\t", "#"):
            current.append(rest[index + 1])
            index += 2
            continue
        if char == "$" and rest[index + 1:index + 2] == "$":
            current.append("$")
            index += 2
            continue
        if char.isspace():
            if current:
                files.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    if current:
        files.append("".join(current))
    return files


def _within(path, folders):
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _check_headers(plan):
    """Every file the preprocessor reads: the wrapper, the copy, or a system header.  (Inside the
    sandbox nothing else could be read anyway; this turns that into a message naming the
    header, not a compiler error.)"""
    own = {os.path.realpath(plan["wrapper"]), os.path.realpath(plan["source_copy"])}
    command = [plan["compiler"], *plan["flags"], "-I", plan["workdir"], "-M", "-MG", "-MT",
               "graphswap-unit", plan["wrapper"]]
    result = subprocess.run(command, capture_output=True, text=True, cwd=plan["workdir"],
                            env=plan["compiler_env"], timeout=600)
    if result.returncode != 0:
        named = [line.rsplit(": Permission denied", 1)[0].rsplit(": ", 1)[-1].strip()
                 for line in result.stderr.splitlines() if ": Permission denied" in line]
        named = [name for name in named if os.path.realpath(name) not in own]
        if named:   # a header the sandbox did not let the preprocessor read
            raise Failure("header", f"reads {named[0]}", named)
        raise Failure("compile", f"compiling {plan['wrapper']} failed (exit "
                                 f"{result.returncode}):\n{result.stderr.strip()}")
    read = _rule_files(result.stdout)
    for name in read:
        real = os.path.realpath(name)
        if real in own or (os.path.isabs(name) and _within(real, plan["include_dirs"])):
            continue
        raise Failure("header", f"reads {name}", read)


def _compile(plan):
    _run([plan["compiler"], *plan["flags"], "-I", plan["workdir"], plan["wrapper"], "-o",
          plan["library"]], plan, f"compiling {plan['wrapper']}")


def _load(plan):
    try:
        library = ctypes.CDLL(plan["library"])
    except OSError as exc:
        raise Failure("load", str(exc)) from None
    try:
        fill = library.graphswap_fill_multiplier_row
    except AttributeError:
        raise Failure("symbol", "graphswap_fill_multiplier_row") from None
    fill.restype = None
    fill.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_uint64)]

    def row(x):
        values = (ctypes.c_uint64 * ROW)()
        fill(x, values)
        return struct.pack(ROW_FORMAT, *values)

    return row


def _evaluate(plan, row, out):
    for order in plan["passes"]:
        for x in order:
            out.write(row(x))
            out.flush()  # rows already written tell the parent where a crash happened
    if plan["concurrent"]:
        results = [None] * len(plan["concurrent"])

        def work(index, order):
            results[index] = b"".join(row(x) for x in order)

        threads = [threading.Thread(target=work, args=(i, order))
                   for i, order in enumerate(plan["concurrent"])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for rows in results:
            out.write(rows)
        out.flush()


def main(argv):
    plan = json.loads(argv[1])
    # The rows go out on the original stdout; the user's code printing goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        _confine(plan)
        _check_copy(plan)
        _check_headers(plan)
        if plan.get("headers_only"):
            out.write(LOADED)
            return 0
        _compile(plan)
        row = _load(plan)
    except Failure as exc:
        sys.stderr.write("\n" + json.dumps({"error": exc.kind, "message": str(exc),
                                            "read": exc.read}) + "\n")
        return FAILED
    except OSError as exc:   # a refused access outside the compiler: the sandbox's answer
        sys.stderr.write("\n" + json.dumps({"error": "sandbox", "message": str(exc),
                                            "read": []}) + "\n")
        return FAILED
    out.write(LOADED)
    out.flush()
    _evaluate(plan, row, out)
    return 0


def _die_with_parent():
    """Linux: be killed when the process that started us dies."""
    try:
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    _die_with_parent()
    sys.exit(main(sys.argv))
