"""Compiling C sources into shared libraries with the system C compiler.

Used at install time (setup.py loads this file directly, without importing the package, so it must
not import TensorFlow or anything graphswap-specific - which is also why CompilerError is not a
GraphswapError: callers inside the package turn it into one) and at run time, to build the shipped kernels
from a source checkout and to compile users' multiplier `.c` files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

LIBRARY_NAME = "libgraphswap_kernels.so"

# -O3 plus OpenMP for the shipped kernels; -march=native unless a portable build is asked for
# (GRAPHSWAP_PORTABLE=1), because the wheel is normally built on the machine that runs it.
BASE_FLAGS = ["-O3", "-std=c11", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra"]


class CompilerError(RuntimeError):
    """The C compiler was missing or rejected the source; the message carries its output."""


def find_compiler() -> str:
    """Return the C compiler to use: $CC, else cc/gcc/clang on PATH."""
    candidates = [os.environ.get("CC")] if os.environ.get("CC") else []
    candidates += ["cc", "gcc", "clang"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    raise CompilerError(
        "no C compiler found (looked for $CC, cc, gcc, clang); install one, "
        "e.g. 'apt-get install gcc', or pass a prebuilt .so instead of a .c file"
    )


def optimisation_flags(portable: bool | None = None) -> list[str]:
    """Flags for speed; vectorised for this machine unless portable."""
    if portable is None:
        portable = os.environ.get("GRAPHSWAP_PORTABLE", "") not in ("", "0")
    flags = list(BASE_FLAGS)
    if not portable:
        flags.append("-march=native")
    return flags


def compile_shared(sources: list[Path], output: Path, include_dirs: list[Path] = (),
                   extra_flags: list[str] = (), libraries: list[str] = (),
                   portable: bool | None = None) -> Path:
    """Compile `sources` into the shared library `output`, atomically (temp file, then rename).

    Raises CompilerError carrying the compiler's own diagnostics when it fails.
    """
    compiler = find_compiler()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=output.name + ".", suffix=".tmp", dir=output.parent)
    os.close(fd)
    command = [compiler, *optimisation_flags(portable), *extra_flags]
    command += [f"-I{d}" for d in include_dirs]
    command += [str(s) for s in sources]
    command += ["-o", tmp_name]
    command += [f"-l{lib}" for lib in libraries]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise CompilerError(
                f"compiling {', '.join(str(s) for s in sources)} failed "
                f"(exit {result.returncode}):\n{result.stderr.strip() or result.stdout.strip()}"
            )
        os.chmod(tmp_name, 0o755)
        os.replace(tmp_name, output)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return output


def native_source_dir(start: Path | None = None) -> Path | None:
    """The repository's native_kernels/ directory next to the package, if present.

    `start` is the package directory (graphswap/); by default the one this file is in."""
    start = Path(start) if start else Path(__file__).resolve().parent.parent
    candidate = start.parent / "native_kernels"
    return candidate if (candidate / "include" / "graphswap_kernels.h").is_file() else None


def build_shipped_library(native_dir: Path, output: Path, portable: bool | None = None) -> Path:
    """Build graphswap's own kernel library (exact float + table-driven kernels) from native_dir."""
    sources = sorted((Path(native_dir) / "src").glob("*.c"))
    if not sources:
        raise CompilerError(f"no C sources found in {native_dir / 'src'}")
    return compile_shared(sources, output, include_dirs=[Path(native_dir) / "include"],
                          extra_flags=["-fopenmp"], libraries=["m"], portable=portable)
