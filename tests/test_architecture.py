"""The package's structure holds: imports go downward only (docs/ARCHITECTURE.md), no import
cycles, no private names reached across modules, no bare ValueError/TypeError/RuntimeError of
graphswap's own (every deliberate error is a GraphswapError), modules of a readable size."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "graphswap"

# The layers, bottom first.  A module may import from its own subpackage and from lower layers.
LAYERS = [
    {"graphswap.errors", "graphswap.tables", "graphswap._version", "graphswap._quiet_import"},
    {"graphswap.input_files", "graphswap.methods"},
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


def test_method_registry_imports_only_the_standard_library():
    """graphswap.methods describes what the command line offers before TensorFlow loads: it
    imports the standard library and graphswap.errors, nothing else."""
    wrong = []
    for node in ast.walk(ast.parse(MODULES["graphswap.methods"].read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        wrong += [name for name in names if name != "graphswap.errors"
                  and name.split(".")[0] not in sys.stdlib_module_names]
    assert not wrong, wrong


def _implementations():
    """(registry, the Implementations table of the code that does the work, API tuple of names,
    API default) of each registry of graphswap.methods."""
    from graphswap import methods, research, swap
    from graphswap.research.training.recovery import SCHEDULE_METHODS
    from graphswap.swap.calibration import RANGE_METHODS
    from graphswap.swap.compensation import CORRECTION_METHODS

    return [(methods.CALIBRATION_REGISTRY, RANGE_METHODS, swap.CALIBRATION_METHODS,
             swap.DEFAULT_CALIBRATION_METHOD),
            (methods.COMPENSATION_REGISTRY, CORRECTION_METHODS, swap.COMPENSATION_METHODS,
             swap.DEFAULT_COMPENSATION),
            (methods.SCHEDULE_REGISTRY, SCHEDULE_METHODS, research.SCHEDULES,
             research.DEFAULT_SCHEDULE)]


def test_every_described_method_is_implemented():
    """Each registry's described names are exactly the names its implementations registered
    (a method described but not implemented, or implemented but not described, fails), and the
    API's tuples and defaults are the registry's."""
    from graphswap import methods

    pairs = _implementations()
    assert {id(registry) for registry, *_ in pairs} == {id(r) for r in methods.REGISTRIES}
    for registry, implementations, names, default in pairs:
        assert implementations.registry is registry
        assert set(implementations) == set(registry.names), registry.kind
        assert names == registry.names and isinstance(names, tuple), registry.kind
        assert default == registry.default and default in names, registry.kind
        assert all(callable(implementations[name]) for name in registry.names)
        with pytest.raises(registry.error, match=f"unknown {registry.kind} 'nonsense'; "
                                                 f"allowed: {', '.join(registry.names)}"):
            implementations["nonsense"]


def _options_named(name: str) -> list:
    """Every click option called `name` of every command of the command line, with its
    command's name."""
    from graphswap.cli import main

    found, groups = [], [main]
    while groups:
        group = groups.pop()
        for command in group.commands.values():
            if hasattr(command, "commands"):
                groups.append(command)
            found += [(command.name, param) for param in command.params if param.name == name]
    return found


@pytest.mark.parametrize("option, registry_name, off_switches", [
    ("calibration_method", "CALIBRATION_REGISTRY", ()),
    ("bias_correction", "COMPENSATION_REGISTRY", ("none",)),
    ("schedule", "SCHEDULE_REGISTRY", ()),
])
def test_command_line_choices_are_the_registries(option, registry_name, off_switches):
    """--calibration-method, --bias-correction and finetune's --schedule offer exactly the
    registry's names (and the command line's own off switch), and their help gives each name's
    summary."""
    from graphswap import methods

    registry = getattr(methods, registry_name)
    options = _options_named(option)
    assert options, f"no command has --{option.replace('_', '-')}"
    for command, param in options:
        assert set(param.type.choices) == set(registry.names) | set(off_switches), command
        assert len(param.type.choices) == len(registry.names) + len(off_switches), command
        assert param.default in (registry.default, None), command
        text = " ".join(param.help.split())
        for method in registry.methods:
            assert f"'{method.name}'" in text and " ".join(method.summary.split()) in text, \
                (command, method.name)


KINDS_DIR = PACKAGE / "swap" / "kinds"
#: the modules of graphswap/swap/kinds that are not one kind each: the registry and what the
#: kinds share
KINDS_SHARED = {"__init__", "registry", "counting"}


def test_every_layer_kind_is_registered_in_one_place():
    """Each kind module registers exactly one LayerKind (one register() call, its KIND), the
    package imports every kind module, no kind is registered anywhere else, and the registry's
    names, in order, are catalog.LAYER_TYPES and the command line's LAYER_TYPES."""
    import importlib

    from graphswap.cli import values
    from graphswap.swap import catalog, kinds

    modules = sorted(path.stem for path in KINDS_DIR.glob("*.py") if path.stem not in KINDS_SHARED)
    assert modules, "no kind module in graphswap/swap/kinds"
    wrong = []
    for stem in modules:
        tree = ast.parse((KINDS_DIR / f"{stem}.py").read_text())
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and getattr(node.func, "id", getattr(node.func, "attr", None)) == "register"]
        if len(calls) != 1:
            wrong.append(f"graphswap/swap/kinds/{stem}.py calls register() {len(calls)} times")
        module = importlib.import_module(f"graphswap.swap.kinds.{stem}")
        if not isinstance(getattr(module, "KIND", None), kinds.LayerKind) \
                or kinds.by_name(module.KIND.name) is not module.KIND:
            wrong.append(f"graphswap.swap.kinds.{stem}.KIND is not its registered LayerKind")
    assert not wrong, "\n".join(wrong)
    assert sorted(m.__name__.rpartition(".")[2] for m in kinds.KIND_MODULES) == modules
    names = tuple(kind.name for kind in kinds.all_kinds())
    assert kinds.all_kinds() == tuple(module.KIND for module in kinds.KIND_MODULES)
    assert names == catalog.LAYER_TYPES == tuple(values.LAYER_TYPES)


def test_every_layer_kind_has_its_export_forms():
    """Every registered kind has its marked (lowered ONNX) class in graphswap.io.lowering and its
    kept-kernel class in graphswap.io.kept_layers - each a form of the kind's stock layer - and
    neither table names a kind that is not registered."""
    from graphswap.io.kept_layers import KEPT_CLASSES
    from graphswap.io.lowering import MARKED_CLASSES
    from graphswap.swap import kinds

    for table, where in ((MARKED_CLASSES, "graphswap.io.lowering.MARKED_CLASSES"),
                         (KEPT_CLASSES, "graphswap.io.kept_layers.KEPT_CLASSES")):
        names = [kind.name for kind in kinds.all_kinds()]
        assert [name for name in names if name not in table] == [], f"missing from {where}"
        assert [name for name in table if name not in names] == [], f"stale in {where}"
        for kind in kinds.all_kinds():
            assert issubclass(table[kind.name], kind.stock), (where, kind.name)
