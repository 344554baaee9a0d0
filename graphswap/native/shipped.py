"""graphswap's own kernel library: where it is (the installed package's, or built from a source
checkout into the user cache, reused only as graphswap recorded it) and loading it, with the
OpenBLAS it links loaded first.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from graphswap.errors import KernelLoadError
from graphswap.native import compiler
from graphswap.native.abi import load_quietly
from graphswap.native.cache import (cache_dir, owner_only_directory, record_artefact,
                                    recorded_artefact, remove_stale)
from graphswap.native.library import KernelLibrary, load_library

_shipped: tuple[Path, str | None] | None = None


def shipped_library_path() -> Path:
    """Path of graphswap's own kernel library, building it from a source checkout if needed.

    An installed package carries the library built by `pip install`; a source checkout (tests run
    from the repository) builds native_kernels/ into the user cache, keyed by the sources' hash and
    the build's fingerprint (compiler, flags, OpenBLAS): a changed toolchain builds anew.  A cached
    build is reused only if its SHA-256 matches the record graphswap wrote when it built it
    (native.cache); anything else at its place is rebuilt, never loaded.  Found once per process
    (again only if the file went away): in a source checkout the lookup hashes every source and
    runs the compiler for its version, ~1.5 ms that every lut_grad gradient call paid.
    """
    return _shipped_location()[0]


def _shipped_location() -> tuple[Path, str | None]:
    """(path, the SHA-256 graphswap recorded when it built it - None for the installed one)."""
    global _shipped
    if _shipped is None or not _shipped[0].is_file():
        _shipped = _locate_shipped_library()
    return _shipped


def _locate_shipped_library() -> tuple[Path, str | None]:
    packaged = Path(__file__).resolve().parent.parent / compiler.LIBRARY_NAME
    if packaged.is_file():
        return packaged, None
    native_dir = compiler.native_source_dir()
    if native_dir is None:
        raise KernelLoadError(
            f"graphswap's kernel library {packaged} is missing and no native_kernels/ sources were "
            f"found to build it; reinstall graphswap with 'pip install .' from its source tree")
    digest = hashlib.sha256(compiler.build_fingerprint().encode())
    for source in sorted([*native_dir.glob("src/*.c"), *native_dir.glob("src/*.h"),
                          *native_dir.glob("include/*.h")]):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    target = owner_only_directory(cache_dir() / "shipped") / \
        f"{digest.hexdigest()[:16]}-{compiler.LIBRARY_NAME}"
    checked = recorded_artefact(target)
    if checked is None:
        remove_stale(target)
        try:
            compiler.build_shipped_library(native_dir, target)
        except compiler.CompilerError as exc:
            raise KernelLoadError(f"building graphswap's kernel library from {native_dir} "
                                  f"failed: {exc}") from None
        checked = record_artefact(target)
    checked.close()
    return target, checked.sha256


_openblas_loaded = False


def _preload_openblas() -> None:
    """Load the scipy-openblas32 library the shipped kernels link, by its path in the installed
    wheel, before the kernels themselves.  They are loaded through /proc/self/fd/N (what loads is
    what was hashed), where their rpath's $ORIGIN no longer names the package folder - and the
    absolute rpath pip's isolated build recorded is gone - so the dynamic loader would not find
    libscipy_openblas.so; once loaded under its soname it is reused."""
    global _openblas_loaded
    if _openblas_loaded:
        return
    _, lib_dir, _ = compiler.openblas_location()
    for candidate in sorted(Path(lib_dir).glob("libscipy_openblas*.so*")):
        load_quietly(str(candidate))
        break
    _openblas_loaded = True


def shipped_library() -> KernelLibrary:
    """graphswap's own kernel library (its forced instruction-set path checked on first load);
    a library built into the cache is loaded only with the hash graphswap recorded for it."""
    path, sha256 = _shipped_location()
    _preload_openblas()
    library = load_library(path, sha256)
    library.check_isa()
    return library
