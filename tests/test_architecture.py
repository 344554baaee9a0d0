"""The package's structure holds: imports go downward only (docs/ARCHITECTURE.md), no import
cycles, no private names reached across modules, no bare ValueError/TypeError/RuntimeError of
graphswap's own (every deliberate error is a GraphswapError), modules of a readable size."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "graphswap"

# The layers, bottom first.  A module may import from its own subpackage and from lower layers.
LAYERS = [
    {"graphswap.errors", "graphswap.tables", "graphswap._version", "graphswap._quiet_import"},
    {"graphswap.input_files"},
    {"graphswap.native"},
    {"graphswap.multipliers"},
    {"graphswap.kernels"},
    {"graphswap.swap"},
    {"graphswap.surgery"},
    {"graphswap.io"},
    {"graphswap.research"},
    {"graphswap.gradients", "graphswap.cli", "graphswap"},
]
MAX_LINES = 450

# Inside graphswap.research, its subpackages are floors, bottom first: a module imports only its
# own floor and the floors below it (graphswap/research/__init__.py re-exports the public API).
RESEARCH_FLOORS = ["graphswap.research.data", "graphswap.research.training",
                   "graphswap.research.analysis", "graphswap.research.exploration"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _unit(module: str) -> str:
    """The layer unit a module belongs to: its subpackage, or itself at the top level."""
    parts = module.split(".")
    candidate = ".".join(parts[:2])
    return candidate if any(candidate in layer for layer in LAYERS) else module


def _layer(module: str) -> int:
    unit = _unit(module)
    for index, layer in enumerate(LAYERS):
        if unit in layer:
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS: add it to the architecture")


def _imports(module: str) -> set[str]:
    """graphswap modules `module` imports (anywhere in the file), resolved to MODULES keys."""
    tree = ast.parse(MODULES[module].read_text())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name.startswith("graphswap") and name != module:
                found.add(name)
    # importing "graphswap.kernels.trust" also imports its parents' __init__ files
    return found


def test_every_module_is_in_a_layer():
    for module in MODULES:
        _layer(module)


def test_imports_only_go_down():
    wrong = []
    for module in MODULES:
        for imported in _imports(module):
            if imported == "graphswap" and module != "graphswap":
                wrong.append(f"{module} imports the package root")
            elif _unit(imported) != _unit(module) and _layer(imported) >= _layer(module) \
                    and module != "graphswap":
                wrong.append(f"{module} (layer {_layer(module)}) imports {imported} "
                             f"(layer {_layer(imported)})")
    assert not wrong, "\n".join(wrong)



def _research_floor(module: str) -> int:
    for index, floor in enumerate(RESEARCH_FLOORS):
        if module == floor or module.startswith(floor + "."):
            return index
    raise AssertionError(f"{module} is in no floor of RESEARCH_FLOORS: add it to one")


def test_research_floors_only_go_down():
    wrong = []
    for module in MODULES:
        if not module.startswith("graphswap.research."):
            continue
        _research_floor(module)     # every research module sits on a floor
        for imported in _imports(module):
            if imported == "graphswap.research":
                wrong.append(f"{module} imports graphswap.research, the floors' top")
            elif imported.startswith("graphswap.research.") \
                    and _research_floor(imported) > _research_floor(module):
                wrong.append(f"{module} (floor {_research_floor(module)}) imports {imported} "
                             f"(floor {_research_floor(imported)})")
    assert not wrong, "\n".join(wrong)

def test_no_import_cycles():
    graph = {module: _imports(module) for module in MODULES}
    # a package's __init__ importing its own submodules is how it exports them: not a cycle
    for module, imported in graph.items():
        graph[module] = {m for m in imported if not module.startswith(m + ".")}
    cycles = []
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not cycles, "\n".join(cycles)


def test_no_private_names_reached_across_modules():
    """`other_module._private` or `from other import _private` is a reach into another module's
    insides; what a module offers the others is public."""
    reaches = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                    "graphswap"):
                for alias in node.names:
                    if alias.name.startswith("_") and alias.name not in ("__version__",
                                                                         "__all__"):
                        if not (node.module == "graphswap._quiet_import"
                                or node.module == "graphswap._version"):
                            reaches.append(f"{module}: from {node.module} import {alias.name}")
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("graphswap"):
                        aliases[alias.asname or alias.name.split(".")[0]] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                reaches.append(f"{module}: {node.value.id}.{node.attr}")
    assert not reaches, "\n".join(reaches)


BARE = ("ValueError", "TypeError", "RuntimeError", "Exception", "KeyError", "OSError")


def test_every_deliberate_error_is_a_graphswap_error():
    """A `raise ValueError(...)` of graphswap's own would reach the CLI as "unexpected
    ValueError"; every error graphswap raises on purpose derives from GraphswapError."""
    bare = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                    and isinstance(node.exc.func, ast.Name) and node.exc.func.id in BARE:
                bare.append(f"{module}:{node.lineno}: raise {node.exc.func.id}(...)")
    assert not bare, "\n".join(bare)


def test_error_classes_derive_from_graphswap_error():
    from graphswap import errors

    for name in dir(errors):
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == \
                errors.__name__:
            assert issubclass(value, errors.GraphswapError), name


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_readable(module):
    path = MODULES[module]
    lines = path.read_text().count("\n")
    if lines > MAX_LINES:
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "longer" in docstring.lower(), (
            f"{module} has {lines} lines (> {MAX_LINES}); split it, or say in its docstring why "
            f"it is longer")
    assert ast.get_docstring(ast.parse(path.read_text())), f"{module} has no module docstring"
