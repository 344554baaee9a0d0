"""Where a user's C source is compiled and run: a child process confined by Landlock
(graphswap/native/sandbox_child.py), so that what the compiler, the assembler, the linker and the
compiled code can read is the approved source's private copy and the system's own files, and what
they can write is one private folder.  Only the table comes back, as data.

graphswap never compiles a file-named C source unconfined without being told to: where the
kernel offers no Landlock (Linux before 5.13, or Landlock disabled at boot), it refuses, unless
the environment variable GRAPHSWAP_UNSANDBOXED_COMPILE=1 (`graphswap --compile-c-unsandboxed`)
says the user accepts the risk; then the
same child runs unconfined (still isolated: `python -I -S`, its own folder, a clean environment)
and a warning says so.

Every child process graphswap starts runs isolated the same way (`isolated_environment`,
`isolated_workdir`): no code from the user's folders, no variables that steer Python.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
import warnings

from graphswap.errors import KernelTrustError

UNSANDBOXED_VARIABLE = "GRAPHSWAP_UNSANDBOXED_COMPILE"
CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
#: folders whose files the confined compiler may read and execute: the system's
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: read only: the loader's configuration and cache, what a process reads of itself
READ_ONLY = ("/etc", "/proc/self", "/proc/meminfo", "/proc/cpuinfo", "/sys/devices/system/cpu")
#: variables a child process keeps (the rest of the environment is left behind)
_KEPT_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "TERM",
                   "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "CC", "CXX", "LD_LIBRARY_PATH",
                   "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
                   "OPENBLAS_L2_SIZE", "CUDA_VISIBLE_DEVICES")
_KEPT_PREFIXES = ("GRAPHSWAP_", "TF_", "LC_")

_warned = False


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none)."""
    try:
        import landlockpy
    except ImportError:
        return 0
    try:
        return landlockpy.abi_version()
    except OSError:
        return 0


def _landlockpy_dir() -> str:
    import landlockpy

    return os.path.dirname(os.path.dirname(os.path.abspath(landlockpy.__file__)))


def confinement(path: str, what: str) -> bool:
    """True when the C source `path` is to be compiled in the Landlock sandbox; False when the
    user opted out on a kernel without one (a warning says so); KernelTrustError otherwise."""
    global _warned
    if landlock_abi() >= 1:
        return True
    if os.environ.get(UNSANDBOXED_VARIABLE, "") == "1":
        if not _warned:
            warnings.warn(f"this kernel offers no Landlock sandbox and {UNSANDBOXED_VARIABLE}=1 "
                          f"is set: graphswap compiles and runs C sources unconfined (files the "
                          f"source makes the compiler read are not covered by its trust)",
                          RuntimeWarning, stacklevel=2)
            _warned = True
        return False
    raise KernelTrustError(
        f"cannot compile the {what} {path}: graphswap compiles a C source only inside a Landlock "
        f"sandbox (so the compiler and the code read nothing but the approved source and system "
        f"files), and this kernel offers none (Landlock needs Linux 5.13 or later with Landlock "
        f"enabled, and the landlockpy package). Nothing was compiled. Give the multiplier as a "
        f".lut table or a trusted 'lib.so:SYMBOL' instead, or accept compiling it unconfined: "
        f"{UNSANDBOXED_VARIABLE}=1 (graphswap --compile-c-unsandboxed COMMAND ...)")


def _system_owned(path: str) -> bool:
    """A folder only root may change (or the user's own, for a compiler in their prefix)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return info.st_uid in (0, os.getuid()) and not info.st_mode & stat.S_IWOTH


def readable_folders(compiler: str) -> list[str]:
    """Folders the confined child may read and execute: the system's, and the compiler's own
    installation prefix (the folder above its bin/) when it lives elsewhere."""
    folders = [f for f in SYSTEM_FOLDERS if os.path.isdir(f) and _system_owned(f)]
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(compiler)))
    if prefix not in ("/", "") and not any(prefix == f or prefix.startswith(f + "/")
                                           for f in folders) and _system_owned(prefix):
        folders.append(prefix)
    return folders


def isolated_environment(**extra: str) -> dict:
    """The environment of a child process: the user's settings graphswap reads, the locale and
    the search PATH, nothing that steers Python (PYTHON*) or imports code."""
    env = {name: value for name, value in os.environ.items()
           if name in _KEPT_VARIABLES or name.startswith(_KEPT_PREFIXES)}
    env.update(extra)
    return env


def compiler_environment(compiler: str, workdir: str) -> dict:
    """The confined compiler's environment: its own folder and the system's on PATH, temporaries
    in the private folder, no variable that adds header or library folders."""
    folder = os.path.dirname(os.path.realpath(compiler))
    return {"PATH": os.pathsep.join(dict.fromkeys([os.path.dirname(compiler), folder, "/usr/bin",
                                                   "/bin"])),
            "LANG": "C", "LC_ALL": "C", "TMPDIR": workdir, "HOME": workdir}


@contextlib.contextmanager
def isolated_workdir(prefix: str = "graphswap-child-"):
    """A fresh owner-only folder (the child's working folder), removed afterwards."""
    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def child_command(plan_json: str) -> list[str]:
    """The command line of the confined child for a plan."""
    return [sys.executable, "-I", "-S", CHILD_SCRIPT, plan_json]


def plan_fields(compiler: str, workdir: str, confined: bool) -> dict:
    """The sandbox's part of a child's plan: what it may read, where it may write."""
    return {"sandbox": confined, "landlockpy_dir": _landlockpy_dir() if confined else "",
            "read_execute": readable_folders(compiler), "read_only": list(READ_ONLY),
            "workdir": workdir, "compiler": compiler,
            "compiler_env": compiler_environment(compiler, workdir)}
