"""The serving half of a graphswap SavedModel, checked op by op and weight by weight against the
embedded Keras model - never trusted on a spot check of its outputs.

A serving graph that answers differently only on some inputs (say, a `tf.where(x == 0, ...)`
branch, or a weight that only matters for them) passes any check of a random batch.  So when
graphswap reopens one of its SavedModels (graphswap.io.dual_savedmodel), it exports the embedded
model again the way `export --format savedmodel` does (`serving_module`, into a private temporary
directory) and compares the two directories' `serving_default` (`serving_form`):

* the structure: every node of the signature's function and of every function it calls -
  op, attributes (names, devices and TensorFlow's internal `_`-attributes aside), the nodes and
  arguments it reads, in order, its control inputs - is reduced to a Merkle hash (names of nodes
  and functions do not enter it, so two tracings of one model agree).  Both ways TensorFlow
  serves a signature are covered: the function the object graph binds to `serving_default`
  (what `tf.saved_model.load` runs) with its captured variables, and the graph-level
  signature_def (what TensorFlow Serving runs), the signature's names, dtypes and shapes
  included;
* the weights: the value of every variable the signature's function captures, read from
  variables/, equals - bit for bit - the variable in the same place of the re-export (the
  embedded model's weights, swapped layers lowered).

Any difference is a SavedModelConsistencyError (graphswap.io.dual_savedmodel words it).  Nothing
of the directory is run for this: its protobuf and its checkpoint are read as data.  A directory
written by another graphswap or TensorFlow version whose export traces differently is refused
too (the message names both versions): re-export it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import tensorflow as tf

from graphswap.errors import ModelLoadError
from graphswap.io.lowering import lower_model
from graphswap.io.savedmodel_program import read_saved_model
from graphswap.io.signatures import input_specs, serving_function, signature_names

SIGNATURE = "serving_default"
#: attributes that name or place things rather than say what is computed
VOLATILE_ATTRS = frozenset({"config_proto", "config", "executor_type", "debug_name"})
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


# ---------------------------------------------------------------------------------------------
# what the export saves
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ServingModule:
    module: object
    concrete: object
    lowered: object
    records: list
    input_names: list
    output_names: list
    specs: list


def serving_module(model) -> ServingModule:
    """The tf.Module `export --format savedmodel` saves for `model`: the model with its swapped
    layers lowered, behind a `serving_default` function with named inputs and outputs."""
    # marked: grouped / channels_first convolutions as plain NHWC Conv2D ops (no XLA function,
    # runs on CPU); the name scopes are harmless here
    lowered, records = lower_model(model, marked=True)
    input_names, output_names = signature_names(model)
    specs = input_specs(model, input_names)
    fn = serving_function(lowered, specs, output_names)
    concrete = fn.get_concrete_function()
    module = tf.Module()
    module.model = lowered
    module.serve = fn
    # state that is not a weight - the seed generator of a random layer that stays in the
    # export (a user's subclass of one; lower_model made the stock ones Identity) - is
    # reachable from the root only through this list
    states = [v for v in lowered.variables if all(v is not w for w in lowered.weights)]
    if states:
        module.model_states = states
    return ServingModule(module, concrete, lowered, records, input_names, output_names, specs)


def save_serving_module(built: ServingModule, directory) -> None:
    tf.saved_model.save(built.module, str(directory), signatures={SIGNATURE: built.concrete})


# ---------------------------------------------------------------------------------------------
# the serving form of a directory
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ServingForm:
    """What a SavedModel directory serves as `serving_default`, reduced for comparison."""

    structure: dict             # part -> hash: the object graph's function, the signature_def
    ops: Counter                # op types of every node the signature reaches
    captures: list              # (variable name, value) of each captured variable, in order
    tensorflow: str             # the TensorFlow version that wrote it


def _digest(*parts) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else repr(part).encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.digest()


class _Hasher:
    """Merkle hashes of nodes and functions of one GraphDef's library (module docstring)."""

    def __init__(self, library: dict):
        self.library = library
        self.functions: dict[str, bytes] = {}
        self.active: set[str] = set()
        self.ops: Counter = Counter()

    def attrs(self, attr_map) -> bytes:
        parts = []
        for key in sorted(attr_map):
            if key.startswith("_") or key in VOLATILE_ATTRS:
                continue
            value = attr_map[key]
            if key == "shared_name":   # numbered per export: the numbers left out (aliases: below)
                parts.append((key, re.sub(rb"\d+", b"#", value.s)))
            elif value.HasField("func"):
                parts.append((key, self.function(value.func.name), self.attrs(value.func.attr)))
            elif value.list.func:
                parts.append((key, [(self.function(f.name), self.attrs(f.attr))
                                    for f in value.list.func]))
            else:
                parts.append((key, value.SerializeToString(deterministic=True)))
        return _digest(*parts)

    def nodes(self, nodes, leaf, reference, roots=None) -> dict[str, bytes]:
        """{node name: hash} of `nodes` (NodeDefs by name; of those `roots` reach, default all);
        `leaf(text)` hashes an input that names no node (a function argument),
        `reference(text)` splits an input into (node name, output part)."""
        hashes: dict[str, bytes] = {}
        for root in (nodes if roots is None else roots):
            stack = [(root, False)]
            while stack:
                name, expanded = stack.pop()
                if name in hashes:
                    continue
                node = nodes[name]
                sources = [reference(text.lstrip("^"))[0] for text in node.input]
                waiting = [s for s in sources if s in nodes and s not in hashes]
                if waiting:
                    if expanded:
                        raise ModelLoadError(f"its graph has a cycle through node {name!r}")
                    stack.append((name, True))
                    stack.extend((s, False) for s in waiting)
                    continue
                inputs, controls = [], []
                for text in node.input:
                    source, part = reference(text.lstrip("^"))
                    value = (_digest(hashes[source], part) if source in nodes
                             else leaf(text.lstrip("^")))
                    (controls if text.startswith("^") else inputs).append(value)
                called = self.function(node.op) if node.op in self.library else b""
                self.ops[node.op] += 1
                hashes[name] = _digest(node.op, called, self.attrs(node.attr), inputs,
                                       sorted(controls))
        return hashes

    def body(self, function, leaves: dict) -> tuple[dict, bytes]:
        """({output name: hash}, hash of the whole body) of FunctionDef `function` whose
        arguments hash as `leaves` (by argument name)."""
        def leaf(text):
            if text not in leaves:
                raise ModelLoadError(f"function {function.signature.name!r} reads {text!r}, "
                                     f"which it does not define")
            return leaves[text]

        def reference(text):
            name, _, part = text.partition(":")
            return name, part

        nodes = {node.name: node for node in function.node_def}
        hashes = self.nodes(nodes, leaf, reference)

        def resolve(text):
            name, part = reference(text)
            return _digest(hashes[name], part) if name in nodes else leaf(text)

        outputs = {arg.name: resolve(function.ret[arg.name]) if arg.name in function.ret
                   else b"" for arg in function.signature.output_arg}
        controls = sorted(hashes.get(v, b"") for v in function.control_ret.values())
        whole = _digest([outputs[arg.name] for arg in function.signature.output_arg], controls,
                        sorted(hashes.values()), [_arg_type(a) for a in
                                                  function.signature.input_arg])
        return outputs, whole

    def function(self, name: str) -> bytes:
        if name in self.functions:
            return self.functions[name]
        if name in self.active:
            raise ModelLoadError(f"its function {name!r} calls itself")
        if name not in self.library:
            raise ModelLoadError(f"its graph calls function {name!r}, which it does not define")
        self.active.add(name)
        function = self.library[name]
        leaves = {arg.name: _digest("argument", index, _arg_type(arg))
                  for index, arg in enumerate(function.signature.input_arg)}
        self.functions[name] = self.body(function, leaves)[1]
        self.active.discard(name)
        return self.functions[name]


def _arg_type(arg) -> bytes:
    return _digest(arg.type, arg.type_attr, arg.number_attr, arg.type_list_attr)


def _graph_reference(text: str):
    name, _, index = text.partition(":")
    return name, index or "0"


def _signature_function(meta_graph) -> tuple[str, list[int]]:
    """(function name, bound input node ids) of the object graph's `serving_default`."""
    graph = meta_graph.object_graph_def
    nodes = graph.nodes

    def child(node_id, name):
        for reference in nodes[node_id].children:
            if reference.local_name == name:
                return reference.node_id
        raise ModelLoadError(f"its object graph has no {name!r} under node {node_id}")

    node = nodes[child(child(0, "signatures"), SIGNATURE)]
    if node.WhichOneof("kind") != "bare_concrete_function":
        raise ModelLoadError(f"its {SIGNATURE} signature is not a concrete function")
    name = node.bare_concrete_function.concrete_function_name
    if name not in graph.concrete_functions:
        raise ModelLoadError(f"its {SIGNATURE} signature names function {name!r}, which the "
                             f"object graph does not describe")
    return name, list(graph.concrete_functions[name].bound_inputs)


def _checkpoint_values(directory: Path, meta_graph, hasher, node_ids: list[int],
                       names: list[str]) -> list[tuple[str, np.ndarray]]:
    """(name, value) of the objects at `node_ids` of the object graph: a variable's value read
    from variables/ (the checkpoint's object graph numbers its nodes as the SavedModel's does);
    a resource's (a lookup table's) digest of its saved state, the functions that create and
    fill it and the asset files they read, as bytes."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(str(directory / "variables" / "variables"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH_KEY))
    values = []
    for node_id, name in zip(node_ids, names):
        if not 0 <= node_id < len(graph.nodes):
            raise ModelLoadError(f"its signature captures object {node_id}, which variables/ "
                                 f"does not hold")
        attributes = graph.nodes[node_id].attributes
        keys = [a.checkpoint_key for a in attributes if a.name == "VARIABLE_VALUE"]
        if len(keys) == 1:
            values.append((name or keys[0], np.asarray(reader.get_tensor(keys[0]))))
            continue
        state = [(a.name, np.asarray(reader.get_tensor(a.checkpoint_key)).tobytes())
                 for a in sorted(attributes, key=lambda a: a.name)]
        digest = _resource_digest(directory, meta_graph, hasher, node_id, keys, state)
        values.append((name or f"resource {node_id}", np.frombuffer(digest, np.uint8)))
    return values


def _resource_digest(directory: Path, meta_graph, hasher, node_id: int, keys, state) -> bytes:
    nodes = meta_graph.object_graph_def.nodes
    kind = nodes[node_id].WhichOneof("kind") if node_id < len(nodes) else None
    if kind == "constant" and not keys:   # a captured tensor: its value, in the graph
        operation = nodes[node_id].constant.operation
        found = [n for n in meta_graph.graph_def.node if n.name == operation]
        if len(found) != 1:
            raise ModelLoadError(f"its signature captures constant {operation!r}, which its "
                                 f"graph does not hold")
        return _digest("constant", found[0].op, hasher.attrs(found[0].attr))
    if keys or kind not in ("resource", "user_object"):
        raise ModelLoadError(f"its signature captures object {node_id}, which is no variable "
                             f"of variables/ and no resource (a {kind})")
    functions = meta_graph.object_graph_def.concrete_functions
    parts = [kind, state]
    for child in sorted(nodes[node_id].children, key=lambda c: c.local_name):
        node = nodes[child.node_id]
        names = ([node.bare_concrete_function.concrete_function_name]
                 if node.WhichOneof("kind") == "bare_concrete_function" else
                 list(node.function.concrete_functions) if node.WhichOneof("kind") == "function"
                 else [])
        for name in names:
            bound = list(functions[name].bound_inputs) if name in functions else []
            parts.append((child.local_name, hasher.function(name),
                          [_bound_digest(directory, meta_graph, i) for i in bound]))
    return _digest(*parts)


def _bound_digest(directory: Path, meta_graph, node_id: int) -> bytes:
    """What an object a resource's function captures stands for: an asset file's bytes."""
    node = meta_graph.object_graph_def.nodes[node_id]
    if node.WhichOneof("kind") == "asset":
        name = meta_graph.asset_file_def[node.asset.asset_file_def_index].filename
        return _digest("asset", (directory / "assets" / name).read_bytes())
    return _digest(node.WhichOneof("kind"))


def serving_form(directory) -> ServingForm:
    """The ServingForm of the SavedModel at `directory`; ModelLoadError (without the directory
    in its message) when its serving signature cannot be read as graphswap writes it."""
    directory = Path(directory)
    proto = read_saved_model(directory)
    if len(proto.meta_graphs) != 1:
        raise ModelLoadError(f"it holds {len(proto.meta_graphs)} meta graphs; graphswap writes "
                             f"one")
    meta_graph = proto.meta_graphs[0]
    library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    hasher = _Hasher(library)
    name, bound = _signature_function(meta_graph)
    if name not in library:
        raise ModelLoadError(f"its {SIGNATURE} function {name!r} is missing from its library")
    function = library[name]
    arguments = list(function.signature.input_arg)
    given = len(arguments) - len(bound)
    if given < 0:
        raise ModelLoadError(f"its {SIGNATURE} function binds more variables than it takes")
    leaves = {arg.name: _digest("input", arg.name, _arg_type(arg)) if index < given
              else _digest("capture", index - given, _arg_type(arg))
              for index, arg in enumerate(arguments)}
    outputs, whole = hasher.body(function, leaves)
    saved = meta_graph.object_graph_def.concrete_functions[name]
    structure = {"function": _digest(whole, sorted(outputs.items()),
                                     saved.canonicalized_input_signature.SerializeToString(
                                         deterministic=True),
                                     saved.output_signature.SerializeToString(
                                         deterministic=True))}
    if SIGNATURE not in meta_graph.signature_def:
        raise ModelLoadError(f"it has no {SIGNATURE} signature_def")
    signature = meta_graph.signature_def[SIGNATURE]
    graph_nodes = {node.name: node for node in meta_graph.graph_def.node}
    roots = [_graph_reference(info.name)[0] for infos in (signature.inputs, signature.outputs)
             for info in infos.values()]
    missing = [root for root in roots if root not in graph_nodes]
    if missing:
        raise ModelLoadError(f"its {SIGNATURE} signature_def names node {missing[0]!r}, which "
                             f"its graph does not hold")
    graph_hashes = hasher.nodes(graph_nodes, lambda text: _digest("missing", text),
                                _graph_reference, roots)
    tensors = {}
    for kind, infos in (("inputs", signature.inputs), ("outputs", signature.outputs)):
        for key in sorted(infos):
            node, index = _graph_reference(infos[key].name)
            placeholder = graph_nodes[node].op == "Placeholder"
            tensors[(kind, key)] = _digest(graph_hashes[node], index,
                                           node if placeholder else "",
                                           infos[key].SerializeToString(deterministic=True)
                                           if placeholder else infos[key].dtype)
    structure["signature_def"] = _digest(sorted(tensors.items()), signature.method_name)
    structure["aliases"] = _digest(_aliased_resources(meta_graph))
    objects = meta_graph.object_graph_def.nodes
    names = [objects[i].variable.name if 0 <= i < len(objects) else "" for i in bound]
    return ServingForm(structure, hasher.ops,
                       _checkpoint_values(directory, meta_graph, hasher, bound, names),
                       meta_graph.meta_info_def.tensorflow_version)


def _aliased_resources(meta_graph) -> int:
    """How many resource nodes share another's shared_name (the same resource under two nodes):
    the hashes leave the export's numbering of shared names out, so this keeps which nodes
    alias which in what is compared."""
    names = [node.attr["shared_name"].s for node in meta_graph.graph_def.node
             if node.attr["shared_name"].s]
    for function in meta_graph.graph_def.library.function:
        names += [node.attr["shared_name"].s for node in function.node_def
                  if node.attr["shared_name"].s]
    return len(names) - len(set(names))


def _reference_form(model) -> ServingForm:
    built = serving_module(model)
    with tempfile.TemporaryDirectory(prefix="graphswap-reexport-") as scratch:
        save_serving_module(built, Path(scratch) / "reference")
        return serving_form(Path(scratch) / "reference")


def reference_form(model) -> ServingForm:
    """The ServingForm of what `export --format savedmodel` writes for `model` now - outside any
    distribution strategy (a strategy's scope is the thread's: finetune --strategy loads the
    model in one, and the export is written without)."""
    if not tf.distribute.has_strategy():
        return _reference_form(model)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_reference_form, model).result()


def _counted(ops: Counter) -> str:
    listed = sorted(ops.items())
    return ", ".join(f"{op} x{count}" for op, count in listed[:6]) + (", ..." if len(listed) > 6
                                                                      else "")


def differences(stored: ServingForm, reference: ServingForm) -> tuple[str, str] | None:
    """None when `stored` serves what `reference` (the re-export) does, else (what differs,
    "structure" or "weights")."""
    if stored.structure != reference.structure:
        where = " and ".join(
            {"function": "in the function tf.saved_model.load runs",
             "signature_def": "in the graph TensorFlow Serving runs (its signature_def)",
             "aliases": "in which of its nodes share one resource (shared_name)"}[part]
            for part in stored.structure if stored.structure[part] != reference.structure.get(part))
        added, removed = stored.ops - reference.ops, reference.ops - stored.ops
        shown = "; ".join(f"{label}: {_counted(ops)}"
                          for label, ops in (("op(s) only in the directory", added),
                                             ("op(s) missing from it", removed)) if ops)
        shown = shown or ("the same ops, wired or parameterised differently: an input, a "
                          "constant or an attribute changed")
        return f"computes differently {where} ({shown})", "structure"
    for (name, value), (_, expected) in zip(stored.captures, reference.captures):
        if value.dtype != expected.dtype or value.shape != expected.shape:
            return (f"the serving weight {name} is {value.dtype}{list(value.shape)}, the embedded "
                    f"model's {expected.dtype}{list(expected.shape)}", "weights")
        if value.tobytes() != expected.tobytes():
            if np.issubdtype(value.dtype, np.number):
                delta = np.abs(value.astype(np.float64) - expected.astype(np.float64))
                largest = float(np.nanmax(delta)) if np.any(~np.isnan(delta)) else float("nan")
            else:
                largest = float("nan")
            changed = int(np.count_nonzero(value != expected)) or value.size
            return (f"max |difference| {largest:.3g} in the serving weight {name} ({changed} of "
                    f"{value.size} value(s) differ; every serving weight must equal the embedded "
                    f"model's bit for bit)", "weights")
    return None
