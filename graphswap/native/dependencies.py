"""The files a kernel brings in besides itself: the headers a C source includes and the libraries a
shared library needs.  Trust is of the hash of the kernel file's own bytes, so graphswap refuses a
kernel that would read anything else a user (or anyone who can write there) could change without
changing that hash:

* a C source may include only the compiler's system headers (the folders `cc -E -v` lists, with
  $CPATH / $C_INCLUDE_PATH left out); every file one preprocessing run read is checked, and the
  translation unit of exactly that run is what is compiled (graphswap.multipliers.csource);
* a shared library may need only libraries the dynamic loader takes from the system library
  directories (/lib, /usr/lib and the folders of /etc/ld.so.conf): its DT_NEEDED names are looked
  up as the loader looks them up - DT_RPATH (of the library and of the libraries that need it,
  unless it has a DT_RUNPATH), $LD_LIBRARY_PATH, DT_RUNPATH, $ORIGIN as the library's folder - and
  one found anywhere else is refused, before anything is loaded.

The folders of the Python interpreter's own RPATH are not looked at: what the interpreter loads
from there is as trusted as the interpreter.
"""

from __future__ import annotations

import glob
import io
import os
import sysconfig

from graphswap.errors import KernelTrustError
from graphswap.native.elf import DynamicSection, read_dynamic_section
from graphswap.native.files import FileContent

_LOADER_DEFAULTS = ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32")
_MAX_OBJECTS = 256
#: subfolders of a search folder the loader also tries: glibc-hwcaps, and the legacy tls and
#: platform ones of glibc before 2.37
_SUBFOLDERS = ("glibc-hwcaps/*", "tls", "tls/*", "tls/*/*", os.uname().machine,
               f"*/{os.uname().machine}", "haswell", "xeon_phi", "avx512_1")


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


class _Search:
    """Looks names up as the dynamic loader would, for one library and what it needs."""

    def __init__(self, library: str, what: str):
        self.library, self.what = library, what
        self.system = system_library_dirs()
        variable = os.environ.get("LD_LIBRARY_PATH", "")
        self.env_dirs = self._entries(variable.replace(";", ":").split(":") if variable else (),
                                      None, "$LD_LIBRARY_PATH")

    def _entries(self, entries, origin: str | None, how: str) -> list[tuple[str, str]]:
        """[(folder, how it is searched)] of RPATH / RUNPATH / $LD_LIBRARY_PATH entries."""
        folders = []
        for entry in entries:
            if origin is None and "$" in entry:
                continue   # $ORIGIN in $LD_LIBRARY_PATH: the interpreter's own folder
            expanded = entry.replace("${ORIGIN}", origin or "").replace("$ORIGIN", origin or "")
            if "$" in expanded:
                raise KernelTrustError(
                    f"the {self.what} {self.library} looks for libraries in {entry!r}, whose "
                    f"$-token graphswap cannot expand ($ORIGIN only); graphswap checks every "
                    f"library a kernel library needs before loading it. Rebuild it without "
                    f"$LIB / $PLATFORM in its RPATH / RUNPATH")
            folder = os.path.abspath(expanded or ".")
            folders.append((folder, f"{how} {entry}" + (f" (= {folder})" if entry != folder
                                                        else "")))
        return folders

    def folders(self, section: DynamicSection, origin: str, inherited: list):
        """([(folder, how)] searched before the loader's cache, in the loader's order; the RPATH
        folders the libraries this one needs inherit)."""
        own = self._entries(section.rpath or (), origin, "its RPATH entry")
        rpath = [] if section.runpath is not None else own + inherited
        order = rpath + self.env_dirs
        order += self._entries(section.runpath or (), origin, "its RUNPATH entry")
        return order, (own + inherited if section.runpath is None else inherited)

    def find(self, name: str, order) -> tuple[str, str] | None:
        """(path, how) of the file the loader would take for DT_NEEDED `name`: from the search
        folders, else from the system's (the loader's cache and default folders); None when it
        is nowhere (the load fails)."""
        if "/" in name:
            return os.path.abspath(name), "a path in its DT_NEEDED entry"
        order = list(order) + [(folder, "the system library directories")
                               for folder in self.system]
        for folder, how in order:
            candidates = [os.path.join(folder, name)]
            if not _within(os.path.realpath(folder), self.system):
                for sub in _SUBFOLDERS:
                    candidates += sorted(glob.glob(os.path.join(glob.escape(folder), sub,
                                                                glob.escape(name))))
            for candidate in candidates:
                if os.path.isfile(candidate):
                    return candidate, how
        return None

    def refuse(self, needed_by: str, name: str, path: str, how: str) -> KernelTrustError:
        chain = "" if needed_by == self.library else f" (needed by {needed_by})"
        return KernelTrustError(
            f"the {self.what} {self.library} needs {name}{chain}, which the dynamic loader would "
            f"load from {path} (found through {how}), outside the system library directories "
            f"({', '.join(_outermost(self.system))}); graphswap trusts a library by the hash of "
            f"its own bytes, and the loader reads what it needs from disk unchecked, so a changed "
            f"{os.path.basename(path)} would run without approval. Nothing was loaded. Link that "
            f"code into the library itself (one shared library from all its sources, or the "
            f"dependency linked statically), or install the dependency in a system library "
            f"directory")


def check_library_dependencies(content: FileContent, what: str = "kernel library") -> None:
    """Refuse (KernelTrustError naming the library, the dependency and where it would come from)
    a library - the bytes in `content` - any of whose dependencies, direct or through the
    libraries it needs, the dynamic loader would take from outside the system library
    directories.  $ORIGIN is the folder of `content.path`.  Nothing is loaded."""
    section = read_dynamic_section(io.BytesIO(content.data), content.path)
    if section is None or not section.needed:
        return
    search = _Search(content.path, what)
    queue = [(content.path, section, [])]
    seen: set = set()
    while queue:
        path, section, inherited = queue.pop()
        order, passed_on = search.folders(section, os.path.dirname(path), inherited)
        # folders outside the system ones where what a system library needs could be found
        elsewhere = [f for f, _ in passed_on + search.env_dirs
                     if not _within(os.path.realpath(f), search.system)]
        for name in section.needed:
            found = search.find(name, order)
            if found is None:
                continue   # nowhere: the loader says so
            dependency, how = found
            if not _within(os.path.realpath(dependency), search.system):
                raise search.refuse(path, name, dependency, how)
            key = (os.path.realpath(dependency), tuple(f for f, _ in passed_on))
            if elsewhere and key not in seen and len(seen) < _MAX_OBJECTS:
                # a system library's own needs are looked up in the folders this one passes on
                seen.add(key)
                try:
                    with open(dependency, "rb") as handle:
                        child = read_dynamic_section(handle, dependency)
                except OSError:
                    child = None
                if child is not None and child.needed:
                    queue.append((dependency, child, passed_on))
