"""Evaluated multipliers, cached per process: built-ins by name, files by kind and content hash
(so a file is compiled or evaluated once per process, and a changed file is a new entry).  A `.c`
or `lib.so:symbol` multiplier is evaluated in a child process (graphswap.multipliers.evaluation)."""

from __future__ import annotations

import threading

from graphswap.errors import KernelSpecError
from graphswap.multipliers.builtins import builtin_multiplier
from graphswap.multipliers.csource import from_c_source
from graphswap.multipliers.record import Multiplier
from graphswap.multipliers.shared_library import from_shared_library
from graphswap.multipliers.table_files import from_bin_file, from_lut_file
from graphswap.native import FileContent

FILE_KINDS = ("c", "so", "lut", "bin")

_cache: dict[tuple, Multiplier] = {}
_cache_lock = threading.Lock()


def builtin(name: str) -> Multiplier:
    """The built-in multiplier `name` (cached)."""
    return _cached(("builtin", name), lambda: builtin_multiplier(name))


def from_file(kind: str, content: FileContent, extra: tuple = ()) -> Multiplier:
    """The multiplier in checked file `content` of `kind` ("c", "so", "lut", "bin"): `extra` is
    (FUNCTION or None,) for "c" and (symbol, options) for "so"."""
    builders = {"c": lambda: from_c_source(content, *extra),
                "so": lambda: from_shared_library(content, *extra),
                "lut": lambda: from_lut_file(content),
                "bin": lambda: from_bin_file(content)}
    return _cached((kind, content.path, content.sha256, tuple(extra)), builders[kind])


def evaluate_passes(kind: str, content: FileContent, extra: tuple, passes,
                    concurrent=()) -> list[Multiplier]:
    """Evaluate a multiplier file again, bypassing the cache: one table per row order in
    `passes`, evaluated one after the other in one process, then one per order in `concurrent`,
    evaluated by as many threads at once (kernels check's determinism and re-entrancy checks).
    A C source runs in the sandbox's process; a shared library in this one (kernels check's own
    child process)."""
    if kind == "c":
        return from_c_source(content, *extra, passes=passes, concurrent=concurrent)
    if kind != "so":
        raise KernelSpecError(f"only C and shared-library multipliers are evaluated anew, not {kind}")
    tables = [from_shared_library(content, *extra, isolated=False, row_order=order)
              for order in passes]
    results: dict = {}

    def evaluate(index, order):
        results[index] = from_shared_library(content, *extra, isolated=False, row_order=order)

    threads = [threading.Thread(target=evaluate, args=(i, order))
               for i, order in enumerate(concurrent)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tables + [results[i] for i in range(len(concurrent)) if i in results]


def _cached(key, build) -> Multiplier:
    with _cache_lock:
        multiplier = _cache.get(key)
    if multiplier is None:
        multiplier = build()
        with _cache_lock:
            _cache[key] = multiplier
    return multiplier


def clear_cache() -> None:
    """Forget the evaluated tables (the next resolution evaluates anew)."""
    with _cache_lock:
        _cache.clear()
