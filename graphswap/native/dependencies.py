"""The files a kernel brings in besides itself: the headers a C source includes and the libraries a
shared library needs.  Trust is of the hash of the kernel file's own bytes, so graphswap refuses a
kernel that would read anything else a user (or anyone who can write there) could change without
changing that hash:

* a C source may include only the compiler's system headers (the folders `cc -E -v` lists, with
  $CPATH / $C_INCLUDE_PATH left out); every file one preprocessing run read is checked, and the
  translation unit of exactly that run is what is compiled (graphswap.multipliers.csource);
* a shared library is loaded only if its ELF file passes an allowlist (graphswap.native.elf_policy:
  nothing in its dynamic section beyond what graphswap knows to be safe - no DT_RPATH /
  DT_RUNPATH, no filtees, no audit libraries, one string table, DT_NEEDED only of plain names),
  and every library it needs, and every library those need in turn, is taken from the root-owned
  system library directories (/lib, /usr/lib and the folders of /etc/ld.so.conf): each file the
  loader could take for a needed name there must be owned by root and writable by root only, as
  must every folder on the way to it.  $LD_LIBRARY_PATH is searched before them: a needed name
  found in one of its folders outside the system library directories is refused, naming the
  variable.  Nothing is loaded before that.

Not looked at: the RPATH of the Python interpreter and of the object that calls dlopen (what the
interpreter loads from there is as trusted as the interpreter), and the RPATH / RUNPATH of the
system's own libraries (root's configuration; their needs are looked up in the system library
directories and $LD_LIBRARY_PATH).
"""

from __future__ import annotations

import collections
import glob
import os
import re
import stat
import sys
import sysconfig

from graphswap.errors import KernelTrustError
from graphswap.native.elf import ElfFormatError, read_dynamic_section
from graphswap.native.elf_policy import ALLOWED_SUMMARY, check_library
from graphswap.native.files import FileContent

_LOADER_DEFAULTS = ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32")
_MAX_OBJECTS = 256
#: subfolders of a search folder the loader also tries: glibc-hwcaps, and the legacy tls and
#: platform ones of glibc before 2.37
_SUBFOLDERS = ("glibc-hwcaps/*", "tls", "tls/*", "tls/*/*", os.uname().machine,
               f"*/{os.uname().machine}", "haswell", "xeon_phi", "avx512_1")
#: $-tokens of $LD_LIBRARY_PATH entries
_ORIGIN = re.compile(r"\$(?:\{ORIGIN\}|ORIGIN(?![A-Za-z0-9_]))")
_ANY_FOLDER = re.compile(r"\$(?:\{(?:LIB|PLATFORM)\}|(?:LIB|PLATFORM)(?![A-Za-z0-9_]))")


def _within(path: str, folders) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


# --------------------------------------------------------------------------------------------
# C sources: headers
# --------------------------------------------------------------------------------------------

def check_source_reads(read: list[str], own: list, source_path: str, system_dirs,
                       what: str = "multiplier source") -> None:
    """Refuse (KernelTrustError naming the file) any file in `read` - what one preprocessor run
    opened - that is neither one of `own` (the private copy of the source, graphswap's wrapper)
    nor under the compiler's `system_dirs`."""
    own = {os.path.realpath(os.fspath(p)) for p in own}
    for name in read:
        real = os.path.realpath(name)
        if real in own or (os.path.isabs(name) and _within(real, system_dirs)):
            continue
        shown = name if os.path.isabs(name) else f'"{name}"'
        where = f" (read from {real})" if os.path.isabs(name) and real != name else ""
        raise KernelTrustError(
            f"the {what} {source_path} includes {shown}{where}, which is not one of the "
            f"compiler's system headers: graphswap trusts a C source by the hash of its own "
            f"bytes and compiles a private copy of them, so it compiles only sources whose "
            f"headers are system headers (<stdint.h>, <stdlib.h>, ... from "
            f"{', '.join(system_dirs)}) - another header could change without that trust "
            f"knowing. Nothing was compiled. Paste what the source needs from that header into "
            f"{os.path.basename(source_path)}, or build a shared library and pass "
            f"'lib.so:SYMBOL'")


# --------------------------------------------------------------------------------------------
# shared libraries: what the dynamic loader would load with them
# --------------------------------------------------------------------------------------------

def _conf_dirs(path: str, depth: int = 0) -> list[str]:
    """The folders listed in an ld.so.conf file and the files it includes."""
    found: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return found
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith("include") and depth < 8:
            for pattern in line.split()[1:]:
                pattern = pattern if os.path.isabs(pattern) else os.path.join(
                    os.path.dirname(path), pattern)
                for included in sorted(glob.glob(pattern)):
                    found += _conf_dirs(included, depth + 1)
        elif line and not line.startswith("hwcap"):
            found += [part for part in line.replace(",", " ").replace(":", " ").split()
                      if os.path.isabs(part)]
    return found


def system_library_dirs() -> tuple[str, ...]:
    """The folders the dynamic loader takes libraries from by default (those of /etc/ld.so.conf,
    which only root administers, then its built-in ones), as real paths, in that order."""
    multiarch = sysconfig.get_config_var("MULTIARCH")
    folders = _conf_dirs("/etc/ld.so.conf")
    if multiarch:
        folders += [f"/lib/{multiarch}", f"/usr/lib/{multiarch}"]
    folders += list(_LOADER_DEFAULTS)
    return tuple(dict.fromkeys(os.path.realpath(f) for f in folders if os.path.isdir(f)))


def _outermost(folders) -> list[str]:
    return [f for f in folders if not _within(f, [o for o in folders if o != f])]


def _env_folders() -> list[tuple[str, str]]:
    """[(folder, how)] of $LD_LIBRARY_PATH as the loader reads it: entries separated by ':' or
    ';', an empty one the current folder, $ORIGIN the interpreter's folder, $LIB / $PLATFORM any
    folder there (globbed), another $-token kept as written."""
    variable = os.environ.get("LD_LIBRARY_PATH", "")
    if not variable:
        return []
    executable = os.path.realpath("/proc/self/exe") if os.path.exists("/proc/self/exe") \
        else os.path.realpath(sys.executable)
    folders = []
    for entry in re.split("[:;]", variable):
        expanded = _ORIGIN.sub(lambda _: os.path.dirname(executable), entry)
        parts = _ANY_FOLDER.split(expanded)
        matches = sorted(glob.glob("*".join(glob.escape(p) for p in parts))) \
            if len(parts) > 1 else [expanded]
        for folder in matches:
            folder = os.path.abspath(folder or ".")
            shown = f" (= {folder})" if entry != folder else ""
            folders.append((folder, f"its $LD_LIBRARY_PATH entry {entry!r}{shown}"))
    return folders


def _candidates(folder: str, name: str, subfolders: dict) -> list[str]:
    """The files the loader could take for `name` in `folder` (the folder, its hwcaps ones;
    `subfolders` caches which of those exist, per folder)."""
    if folder not in subfolders:
        subfolders[folder] = [folder] + sorted(
            path for sub in _SUBFOLDERS
            for path in glob.glob(os.path.join(glob.escape(folder), sub)) if os.path.isdir(path))
    found = (os.path.join(where, name) for where in subfolders[folder])
    return [path for path in found if os.path.isfile(path)]


def _not_roots(path: str, system, examined: dict) -> str | None:
    """Why the file at `path` (in a system library directory) could change without root: a
    symbolic link out of those directories, or the file, a folder on the way to it or to a link
    on the way, owned by someone else or writable by group or others.  None: root's alone."""
    real = os.path.realpath(path)
    if not _within(real, system):
        return f"it is a link to {real}, outside them"
    folders, hop = [os.path.dirname(real)], os.path.abspath(path)
    for _ in range(40):   # every link followed: the folder it is in could retarget it
        folders.append(os.path.realpath(os.path.dirname(hop)))
        if not os.path.islink(hop):
            break
        hop = os.path.normpath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
    chain = [real]
    for folder in folders:
        while folder not in chain:
            chain.append(folder)
            folder = os.path.dirname(folder)
    for item in chain:
        if item not in examined:
            try:
                info = os.stat(item)
            except OSError as exc:
                examined[item] = f"{item} cannot be examined ({exc.strerror or exc})"
                continue
            writers = info.st_mode & 0o022
            examined[item] = (
                f"{item} belongs to uid {info.st_uid}, not root" if info.st_uid != 0 else
                f"{item} may be written by its group or by others (permissions "
                f"{stat.S_IMODE(info.st_mode):04o})" if writers else None)
        if examined[item]:
            return examined[item]
    return None


def _needs_of(path: str) -> tuple[str, ...]:
    """The DT_NEEDED names of a system library (none when it cannot be read: the loader says)."""
    try:
        with open(path, "rb") as handle:
            section = read_dynamic_section(handle, path)
    except (OSError, ElfFormatError):
        return ()
    return section.needed if section is not None else ()


def _refusal(path: str, what: str, reason: str) -> KernelTrustError:
    return KernelTrustError(
        f"the {what} {path} is refused: {reason}. graphswap loads a shared library only if it is "
        f"{ALLOWED_SUMMARY}, so that nothing but its approved bytes and root's system libraries "
        f"loads with it. Nothing was loaded. Rebuild it as an ordinary shared library with "
        f"`cc -shared -fPIC ...` (no -Wl,-rpath, no filters, no audit libraries), link other "
        f"code into it statically, or install the libraries it needs in a system library "
        f"directory")


def check_library_dependencies(content: FileContent, what: str = "kernel library") -> None:
    """Refuse (KernelTrustError naming the library, what is wrong, what is allowed and what to do)
    a library - the bytes in `content` - whose ELF file does not pass the allowlist of
    graphswap.native.elf_policy, or any of whose dependencies, direct or through the libraries it
    needs, the dynamic loader could take from a file that someone other than root can change.
    Nothing is loaded."""
    try:
        allowed = check_library(content.data)
    except ElfFormatError as exc:
        raise _refusal(content.path, what, str(exc)) from None
    system = system_library_dirs()
    order = _env_folders() + [(folder, "the system library directories") for folder in system]
    shown = ", ".join(_outermost(system))
    queue = collections.deque([(content.path, allowed.needed)])
    seen: set[str] = set()
    examined: dict = {}
    subfolders: dict = {}
    while queue:
        needed_by, names = queue.popleft()
        chain = "" if needed_by == content.path else f" (needed by {needed_by})"
        for name in names:
            first = None
            for folder, how in order:
                for candidate in _candidates(folder, name, subfolders):
                    if not _within(os.path.realpath(folder), system):
                        raise KernelTrustError(
                            f"the {what} {content.path} needs {name}{chain}, which the dynamic "
                            f"loader would load from {candidate} (found through {how}), outside "
                            f"the system library directories ({shown}); graphswap trusts a "
                            f"library by the hash of its own bytes, and the loader reads what it "
                            f"needs from disk unchecked, so a changed "
                            f"{os.path.basename(candidate)} would run without approval. Nothing "
                            f"was loaded. Link that code into the library itself (one shared "
                            f"library from all its sources, or the dependency linked "
                            f"statically), install the dependency in a system library "
                            f"directory, or take that folder out of $LD_LIBRARY_PATH")
                    reason = _not_roots(candidate, system, examined)
                    if reason:
                        raise KernelTrustError(
                            f"the {what} {content.path} needs {name}{chain}, which the dynamic "
                            f"loader could load from {candidate} in the system library "
                            f"directories ({shown}), but {reason}: it could change without "
                            f"the library's hash changing, and the loader reads it unchecked. "
                            f"Nothing was loaded. Have the administrator make it and its "
                            f"folders root's and writable by root only, or link that code into "
                            f"the library itself (the dependency linked statically)")
                    first = first or candidate
            # nowhere: the load fails (or the process has it loaded already: nothing is read)
            key = os.path.realpath(first) if first else None
            if key and key not in seen and len(seen) < _MAX_OBJECTS:
                seen.add(key)
                queue.append((first, _needs_of(first)))
