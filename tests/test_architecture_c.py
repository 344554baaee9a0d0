"""The C kernels' structure holds: the table (LUT) kernels' per-ISA files are reached only through
the run-time dispatch (lut_table.c, gs_lut_ops_for), never from each other nor from shared code,
and take no part in choosing a path; no .c file is #included; the #include graph of
native_kernels/ has no cycle.

The sources are read as text: comments, string and character literals blanked, then function
definitions found at brace depth 0 and every other mention of their names counted as a use
(prototypes excepted)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parent.parent / "native_kernels"

# The one place that names the per-ISA routines of the table kernels.
DISPATCH = {"lut_table.c"}
# What picks an instruction-set path: the dispatch's business, not an ISA file's.
SELECTORS = {"gs_isa", "gs_lut_ops_for"}

_TARGET = re.compile(r"#\s*pragma\s+GCC\s+target\b|__attribute__\s*\(\(\s*target(_clones)?\s*\(")
_IDENT_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)


def blank_comments(text: str) -> str:
    """text with comments, string and character literals replaced by spaces (offsets kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        two = text[i:i + 2]
        if two == "/*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif two == "//":
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text[i] in "\"'":
            end = i + 1
            while end < n and text[end] != text[i] and text[end] != "\n":
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:end]))
        i = end
    return "".join(out)


def _directive_mask(text: str) -> list[bool]:
    """Per character: inside a preprocessor directive (continuation lines included)."""
    mask = [False] * len(text)
    pos = 0
    directive = False
    for line in text.splitlines(keepends=True):
        if not directive:
            directive = line.lstrip().startswith("#")
        if directive:
            mask[pos:pos + len(line)] = [True] * len(line)
            directive = line.rstrip("\n").endswith("\\")
        pos += len(line)
    return mask


class Source:
    """One C file as the checks read it."""

    def __init__(self, path: Path):
        self.path = path
        self.name = path.name
        self.raw = path.read_text()
        self.text = blank_comments(self.raw)
        self.directive = _directive_mask(self.text)
        depth, self.depth = 0, []
        for ch, in_directive in zip(self.text, self.directive):
            self.depth.append(depth)
            if not in_directive:
                depth += ch == "{"
                depth -= ch == "}"

    def _after_parens(self, open_paren: int) -> int:
        """Index just past the parenthesis group opening at open_paren."""
        level = 0
        for i in range(open_paren, len(self.text)):
            level += self.text[i] == "("
            level -= self.text[i] == ")"
            if level == 0:
                return i + 1
        return len(self.text)

    def _next_char(self, i: int) -> str:
        rest = self.text[i:].lstrip()
        return rest[:1]

    def isa_specific(self) -> bool:
        """Compiled for an instruction set beyond the baseline (by name or target attributes)."""
        return bool(re.search(r"_avx(2|512)\w*\.c$", self.name)) or bool(_TARGET.search(self.text))

    def definitions(self) -> dict[str, bool]:
        """Functions defined here: name -> whether it has external linkage."""
        found = {}
        for m in _IDENT_CALL.finditer(self.text):
            start = m.start(1)
            if self.depth[start] != 0 or self.directive[start]:
                continue
            if self._next_char(self._after_parens(m.end() - 1)) != "{":
                continue
            head_start = max(self.text.rfind(";", 0, start), self.text.rfind("}", 0, start),
                             self.text.rfind("\n#", 0, start))
            found[m.group(1)] = "static" not in self.text[head_start + 1:start].split()
        return found

    def uses(self, names: set[str]) -> dict[str, list[int]]:
        """Lines where each of `names` is called or referenced (prototypes excepted)."""
        if not names:
            return {}
        hits: dict[str, list[int]] = {}
        pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, names))) + r")\b")
        for m in pattern.finditer(self.text):
            i = m.start()
            if not self.directive[i] and self.depth[i] == 0 and self._next_char(m.end()) == "(":
                after = self._next_char(self._after_parens(self.text.index("(", m.end())))
                if after in (";", ","):
                    continue  # a declaration
            hits.setdefault(m.group(1), []).append(self.text.count("\n", 0, i) + 1)
        return hits

    def includes(self) -> list[str]:
        return [m.group(2) for m in _INCLUDE.finditer(self.raw) if m.group(1) == '"' or
                m.group(2).endswith(".c")]


def sources(native: Path = NATIVE) -> dict[str, Source]:
    files = sorted([*native.glob("src/*.c"), *native.glob("src/*.h"), *native.glob("include/*.h")])
    return {path.name: Source(path) for path in files}


def isa_lut_files(srcs: dict[str, Source]) -> list[str]:
    return [name for name, s in srcs.items() if name.startswith("lut") and name.endswith(".c")
            and s.isa_specific()]


def foreign_uses(srcs: dict[str, Source], isa_file: str) -> list[str]:
    """Where files other than isa_file and the dispatch call or name isa_file's functions."""
    exported = {name for name, external in srcs[isa_file].definitions().items() if external}
    found = []
    for name, s in srcs.items():
        if name == isa_file or name in DISPATCH:
            continue
        for function, lines in sorted(s.uses(exported).items()):
            found.append(f"{name}:{','.join(map(str, lines))} uses {function} ({isa_file})")
    return found


def include_cycle(srcs: dict[str, Source]) -> list[str] | None:
    """A cycle of quoted #includes among native_kernels' files, or None."""
    graph = {name: [inc.rsplit("/", 1)[-1] for inc in s.includes()] for name, s in srcs.items()}
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


SOURCES = sources()
ISA_FILES = isa_lut_files(SOURCES)


def test_the_parser_sees_the_table_kernels():
    """Guards the checks below against reading nothing: the known ISA files and their entry points
    are found, and the dispatch names them."""
    assert {"lut_avx2.c", "lut_avx512.c", "lut_gather_avx2.c"} <= set(ISA_FILES)
    assert not (DISPATCH & set(ISA_FILES)), "the dispatch must be ISA-neutral (baseline x86-64)"
    assert SOURCES["lut_avx512.c"].definitions().get("gs_lut_kernel_avx512") is True
    assert SOURCES["lut_avx2.c"].definitions().get("gs_quantize_map_avx2") is True
    assert SOURCES["lut_scalar.c"].definitions().get("gs_lut_kernel_scalar") is True
    dispatch_uses = SOURCES["lut_table.c"].uses({"gs_lut_kernel_avx512", "gs_lut_kernel_avx2"})
    assert set(dispatch_uses) == {"gs_lut_kernel_avx512", "gs_lut_kernel_avx2"}
    # a prototype is not a use, a call in an inline body is
    assert "gs_lut_kernel_avx2" not in SOURCES["lut_internal.h"].uses({"gs_lut_kernel_avx2"})


@pytest.mark.parametrize("isa_file", ISA_FILES)
def test_isa_files_are_reached_only_through_the_dispatch(isa_file):
    """No other file - another ISA's, shared code, a header's inline function - calls or names the
    functions of an ISA-specific table-kernel file: only the dispatch does."""
    assert foreign_uses(SOURCES, isa_file) == []


@pytest.mark.parametrize("isa_file", ISA_FILES)
def test_isa_files_do_not_choose_a_path(isa_file):
    """An ISA file runs the path it was chosen for: it never asks which path is in use, nor goes
    back through the dispatch."""
    assert SOURCES[isa_file].uses(SELECTORS) == {}


def test_no_c_file_is_included():
    included = [f"{name} includes {inc}" for name, s in SOURCES.items() for inc in s.includes()
                if inc.endswith(".c")]
    assert included == []


def test_the_include_graph_has_no_cycle():
    assert include_cycle(SOURCES) is None
