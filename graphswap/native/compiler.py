"""Compiling C sources into shared libraries with the system C compiler.

Used at install time (setup.py loads this file directly, without importing the package, so it must
not import TensorFlow or anything graphswap-specific - which is also why CompilerError is not a
GraphswapError: callers inside the package turn it into one) and at run time, to build the shipped kernels
from a source checkout, to compile users' multiplier `.c` files and graphswap's TensorFlow op (C++).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

LIBRARY_NAME = "libgraphswap_kernels.so"

# Users' kernels (compile_shared) get -march=native unless a portable build is asked for
# (GRAPHSWAP_PORTABLE=1).  graphswap's own library never does: it is built for baseline x86-64 and
# carries per-ISA code paths chosen at run time (native_kernels/src/common.c), so one build runs on
# every x86-64 CPU.
BASE_FLAGS = ["-O3", "-std=c11", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra"]


class CompilerError(RuntimeError):
    """The C (or C++) compiler was missing or rejected the source; the message carries its output."""


def _find_tool(variable: str, names: list[str], missing: str) -> str:
    """$variable, else the first of `names` on PATH; CompilerError(`missing`) if none."""
    candidates = [os.environ.get(variable)] if os.environ.get(variable) else []
    for name in candidates + names:
        path = shutil.which(name)
        if path:
            return path
    raise CompilerError(missing)


def find_compiler() -> str:
    """Return the C compiler to use: $CC, else cc/gcc/clang on PATH."""
    return _find_tool("CC", ["cc", "gcc", "clang"],
                      "no C compiler found (looked for $CC, cc, gcc, clang); install one, "
                      "e.g. 'apt-get install gcc', or pass a prebuilt .so instead of a .c file")


def find_cxx_compiler() -> str:
    """Return the C++ compiler to use: $CXX, else c++/g++/clang++ on PATH."""
    return _find_tool("CXX", ["c++", "g++", "clang++"],
                      "no C++ compiler found (looked for $CXX, c++, g++, clang++); install one, "
                      "e.g. 'apt-get install g++'")


def optimisation_flags(portable: bool | None = None) -> list[str]:
    """Flags for speed; vectorised for this machine unless portable."""
    if portable is None:
        portable = os.environ.get("GRAPHSWAP_PORTABLE", "") not in ("", "0")
    flags = list(BASE_FLAGS)
    if not portable:
        flags.append("-march=native")
    return flags


def _compile_atomically(command: list[str], sources: list[Path], output: Path) -> Path:
    """Run `command` + sources + ["-o", temp] and rename the temp file to `output`."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=output.name + ".", suffix=".tmp", dir=output.parent)
    os.close(fd)
    try:
        # in the output's folder: nothing of the user's current folder is read
        result = subprocess.run([*command, "-o", tmp_name], capture_output=True, text=True,
                                timeout=600, cwd=output.parent)
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


def compile_shared(sources: list[Path], output: Path, include_dirs: list[Path] = (),
                   extra_flags: list[str] = (), libraries: list[str] = (),
                   portable: bool | None = None) -> Path:
    """Compile `sources` into the shared library `output`, atomically (temp file, then rename).

    Raises CompilerError carrying the compiler's own diagnostics when it fails.
    """
    command = [find_compiler(), *optimisation_flags(portable), *extra_flags]
    command += [f"-I{d}" for d in include_dirs]
    command += [str(s) for s in sources]
    command += [f"-l{lib}" for lib in libraries]
    return _compile_atomically(command, sources, output)


# --------------------------------------------------------------------------------------------
# users' C sources are compiled in the sandbox (graphswap/native/sandbox_child.py); here: the
# compiler's own header folders, which a source may include from
# --------------------------------------------------------------------------------------------

#: variables that add folders to the compiler's header search: left out when asking for its own
_SEARCH_VARIABLES = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH")


def _run(command: list[str], what: str, env=None, input_text=None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env,
                            input=input_text)
    if result.returncode != 0:
        raise CompilerError(f"{what} failed (exit {result.returncode}):\n"
                            f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def system_include_dirs(compiler: str | None = None) -> tuple[str, ...]:
    """The folders the compiler itself searches for <...> headers (what `cc -E -v` lists, with
    $CPATH / $C_INCLUDE_PATH left out of its environment), as real paths."""
    return _system_include_dirs(compiler or find_compiler())


_include_dirs_cache: dict[str, tuple[str, ...]] = {}


def _system_include_dirs(compiler: str) -> tuple[str, ...]:
    if compiler not in _include_dirs_cache:
        env = {k: v for k, v in os.environ.items() if k not in _SEARCH_VARIABLES}
        result = _run([compiler, "-xc", "-E", "-v", "-"], "asking the C compiler for its header "
                      "folders", env=env, input_text="")
        lines, listed, inside = result.stderr.splitlines(), [], False
        for line in lines:
            if line.startswith("#include <...> search starts here"):
                inside = True
            elif line.startswith("End of search list"):
                inside = False
            elif inside and line.strip():
                listed.append(os.path.realpath(line.strip().split(" (")[0]))
        _include_dirs_cache[compiler] = tuple(listed)
    return _include_dirs_cache[compiler]


def compile_cxx_shared(source: Path, output: Path, flags: list[str]) -> Path:
    """Compile one C++ source into the shared library `output` (temp file, then rename); `flags`
    carry the include paths and libraries.  Raises CompilerError with the compiler's output."""
    command = [find_cxx_compiler(), "-O2", "-shared", "-fPIC", "-w", str(source), *flags]
    return _compile_atomically(command, [source], output)


def native_source_dir(start: Path | None = None) -> Path | None:
    """The repository's native_kernels/ directory next to the package, if present.

    `start` is the package directory (graphswap/); by default the one this file is in."""
    start = Path(start) if start else Path(__file__).resolve().parent.parent
    candidate = start.parent / "native_kernels"
    return candidate if (candidate / "include" / "graphswap_kernels.h").is_file() else None


def openblas_location() -> tuple[Path, Path, str]:
    """(include dir, lib dir, library name) of the scipy-openblas32 wheel the float kernels link.

    It is a build and run dependency of graphswap's own library (symbols prefixed scipy_)."""
    try:
        import scipy_openblas32
    except ImportError:
        raise CompilerError(
            "graphswap's kernel library links OpenBLAS from the scipy-openblas32 package, which is "
            "not installed; 'pip install scipy-openblas32'") from None
    return (Path(scipy_openblas32.get_include_dir()), Path(scipy_openblas32.get_lib_dir()),
            scipy_openblas32.get_library())


# Flags of graphswap's own library: baseline x86-64 (no -march), exact float semantics for the
# bit-exact quantization (no FMA contraction), OpenMP.
SHIPPED_FLAGS = ["-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing"]


def compiler_identity(compiler: str) -> list[str]:
    """[path, first line of `compiler --version`] (the version left out if it cannot be run):
    what of a toolchain goes into a cached build's name."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = []
    return [compiler, *version]


def build_fingerprint() -> str:
    """What else than the sources decides the shipped library's binary: the compiler (path and
    version), the flags and the OpenBLAS it links (path and version)."""
    try:
        import scipy_openblas32

        openblas = f"{scipy_openblas32.get_lib_dir()} {getattr(scipy_openblas32, '__version__', '')}"
    except ImportError:
        openblas = "missing"
    return "|".join([*compiler_identity(find_compiler()), " ".join(BASE_FLAGS + SHIPPED_FLAGS),
                     openblas])


def build_shipped_library(native_dir: Path, output: Path, portable: bool | None = None) -> Path:
    """Build graphswap's own kernel library (exact float + table-driven kernels) from native_dir.

    Always portable (`portable` is accepted for compatibility and ignored): per-ISA code inside the
    library is selected at run time.  Links libscipy_openblas with an rpath to the installed wheel
    ($ORIGIN/../scipy_openblas32/lib for an installed graphswap, and the absolute path)."""
    del portable
    sources = sorted((Path(native_dir) / "src").glob("*.c"))
    if not sources:
        raise CompilerError(f"no C sources found in {native_dir / 'src'}")
    include_dir, lib_dir, lib_name = openblas_location()
    rpaths = ["$ORIGIN/../scipy_openblas32/lib", str(lib_dir)]
    link = [f"-L{lib_dir}", *(f"-Wl,-rpath,{p}" for p in rpaths)]
    return compile_shared(sources, output, include_dirs=[Path(native_dir) / "include", include_dir],
                          extra_flags=[*SHIPPED_FLAGS, *link],
                          libraries=[lib_name, "pthread", "m"], portable=True)
