"""A C multiplier's table, compiled and evaluated in the sandbox (graphswap/native/sandbox.py).

The caller (csource: integer multipliers, fp8_circuits: FP8 ones) has read the approved source
once and written graphswap's wrapper around it.  Here a private folder gets a copy of exactly the
approved bytes and the wrapper; the confined child checks the copy's hash, compiles both, loads
the result and sends the raw rows back.  The compiled library never leaves that folder (it is
removed with it): what graphswap keeps is the table, in the owner-only cache, reused only while
its bytes match graphswap's record (graphswap.native.cache), keyed by the source's hash, the
wrapper and the compiler.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np

from graphswap.errors import KernelSpecError, KernelTrustError
from graphswap.multipliers import table_child
from graphswap.multipliers.evaluation import EvaluationPlan, ROW_BYTES, run_row_child
from graphswap.native import (FileContent, cache_dir, check_source_reads, compiler,
                              owner_only_directory, record_artefact, recorded_artefact,
                              remove_stale, write_atomically)
from graphswap.native import sandbox

#: the wrapper includes the source copy by this name, in the same private folder
def source_copy_name(path: str) -> str:
    return "source_" + re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(path))


_TABLE_VERSION = "sandboxed-1"
ALL_ROWS = list(range(table_child.ROW))


def _cached_table_path(content: FileContent, key: str):
    folder = owner_only_directory(owner_only_directory(cache_dir() / "multipliers")
                                  / content.sha256[:24])
    return folder / f"table-{key}.raw"


def _read_cached(path) -> np.ndarray | None:
    checked = recorded_artefact(path)
    if checked is None:
        return None
    try:
        data = os.pread(checked.fd, ROW_BYTES * table_child.ROW + 1, 0)
    finally:
        checked.close()
    if len(data) != ROW_BYTES * table_child.ROW:
        return None
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)


def _store(path, raw: np.ndarray) -> None:
    remove_stale(path)
    write_atomically(path, raw.astype("<u8").tobytes())
    record_artefact(path).close()


def _raw_tables(body: bytes, orders) -> list[np.ndarray]:
    """The tables (uint64[65536], index (x << 8) | y) of consecutive passes in `body`."""
    tables, offset = [], 0
    for order in orders:
        raw = np.empty(table_child.ROW * table_child.ROW, dtype=np.uint64)
        for x in order:
            raw[x << 8:(x + 1) << 8] = np.frombuffer(body, dtype="<u8", count=table_child.ROW,
                                                     offset=offset)
            offset += ROW_BYTES
        tables.append(raw)
    return tables


def check_headers(content: FileContent, what: str) -> None:
    """Refuse (KernelTrustError naming the header) a C source that includes anything but system
    headers: the preprocessor alone, in the sandbox, on a private copy (nothing is compiled).
    Where the kernel has no sandbox and the user did not opt out, this early check is left to
    the compile, which refuses anyway."""
    try:
        sandbox.confinement(content.path, what)
    except KernelTrustError:
        return
    try:
        compiled_tables(content, f'#include "{source_copy_name(content.path)}"\n', "headers",
                        False, what, KernelSpecError, passes=[], headers_only=True)
    except KernelSpecError:
        return   # not valid C: the compiler says so when the source is compiled


def compiled_tables(content: FileContent, wrapper: str, name: str, signed: bool, what: str,
                    compile_failed, passes=None, concurrent=(),
                    headers_only: bool = False) -> list[np.ndarray]:
    """The raw tables of the multiplier `name` (wrapper: graphswap's C around the source, which
    it includes by source_copy_name()): one per row order in `passes` (evaluated one after the
    other in one confined process; default one pass in row order, cached), then one per order
    in `concurrent` (evaluated by as many threads at once).  `compile_failed(message)` is the
    error a compiler failure raises; a header outside the system's is a KernelTrustError."""
    confined = sandbox.confinement(content.path, what)
    cc = compiler.find_compiler()
    key = hashlib.sha256("|".join([content.sha256, name, wrapper, cc, _TABLE_VERSION])
                         .encode()).hexdigest()[:20]
    default = passes is None and not concurrent
    passes = [ALL_ROWS] if passes is None else [list(p) for p in passes]
    concurrent = [list(c) for c in concurrent]
    cached_path = _cached_table_path(content, key)
    if default:
        cached = _read_cached(cached_path)
        if cached is not None:
            return [cached]
    include_dirs = list(compiler.system_include_dirs(cc))
    with sandbox.isolated_workdir("graphswap-sandbox-") as workdir:
        copy = os.path.join(workdir, source_copy_name(content.path))
        wrapper_path = os.path.join(workdir, f"wrapper-{key}.c")
        with open(copy, "wb") as handle:
            handle.write(content.data)
        with open(wrapper_path, "w", encoding="utf-8") as handle:
            handle.write(wrapper)
        plan = {**sandbox.plan_fields(cc, workdir, confined), "sha256": content.sha256,
                "source_copy": copy, "wrapper": wrapper_path,
                "library": os.path.join(workdir, "multiplier.so"),
                "flags": compiler.optimisation_flags(portable=True),
                "include_dirs": include_dirs, "passes": passes, "concurrent": concurrent,
                "headers_only": headers_only}
        described = EvaluationPlan(source=content.path, name=name, library=plan["library"],
                                   sha256="", mode="wrapper")

        def refusal(report):
            return _refusal(report, content, what, include_dirs, copy, wrapper_path,
                            compile_failed)

        body = run_row_child(sandbox.child_command(json.dumps(plan)), described, signed,
                             sum(map(len, passes + concurrent)), workdir,
                             sandbox.isolated_environment(), refusal=refusal)
    tables = _raw_tables(body, passes + concurrent)
    if default:
        _store(cached_path, tables[0])
    return tables


def _refusal(report: dict, content: FileContent, what: str, include_dirs, copy: str,
             wrapper_path: str, compile_failed) -> Exception:
    kind, message = report.get("error"), str(report.get("message", ""))
    if kind == "header":
        read = [str(name) for name in report.get("read", [])]
        check_source_reads(read, [copy, wrapper_path], content.path, include_dirs, what)
        return KernelTrustError(f"the {what} {content.path} {message}, outside what the sandbox "
                                f"lets the compiler read; nothing was compiled")
    if kind == "compile":
        message = message.replace(copy, content.path)
        message = re.sub(r"\S*/wrapper-[0-9a-f]+\.c", "graphswap's generated wrapper", message)
        if any(word in message for word in ("Permission denied", "file not found",
                                            "No such file")):
            message += ("\n(graphswap compiles C sources in a sandbox where the compiler, the "
                        "assembler and the linker read only the approved source and the "
                        "system's files: a file outside them cannot be read)")
        return compile_failed(message)
    if kind == "hash":
        return KernelTrustError(f"{content.path}: the private copy changed after it was checked; "
                                f"nothing was compiled. Run the command again")
    if kind == "sandbox":
        return KernelTrustError(f"cannot compile the {what} {content.path}: the sandbox refused "
                                f"({message}); nothing ran unconfined")
    return compile_failed(f"the compiled multiplier does not load: {message} (an undefined "
                          f"function?)")
