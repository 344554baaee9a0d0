"""What a SavedModel may run when graphswap opens it: a check of `saved_model.pb` before
`tf.saved_model.load` sees it.

Opening a graphswap SavedModel runs its `serving_default` signature on a sample batch (the
consistency check of graphswap.io.dual_savedmodel), and a SavedModel is a program: its graph can
write files (WriteFile, SaveV2), print, call back into Python (PyFunc), and `tf.saved_model.load`
itself runs the initialisers of restored resources and the restore functions of saveable objects.
So before anything is loaded, the protobuf is parsed and refused unless

* its object graph holds only what graphswap's own export writes: plain user objects, variables,
  functions, assets and constants - no resources (their initialisers run on load), no saveable
  objects or registered savers (their restore functions run on load);
* every function reachable from a callable object (the signatures among them) uses only stateless ops
  plus reading variables, calling functions and assertions (`ALLOWED_STATEFUL_OPS`), and none of
  the stateless ops that read files (`FILE_READING_OPS`).

That is what TensorFlow 2's `tf.saved_model.load` and a call of a loaded signature run. The
graph-level parts kept for TensorFlow 1 loaders (the variable initialisers behind
`__saved_model_init_op`, the saver's SaveV2/RestoreV2 functions) are reachable from neither and
never run by graphswap.  The export applies the same check before it writes, so
what graphswap writes it can open again.
"""

from __future__ import annotations

from pathlib import Path

from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry  # no public way to ask is_stateful

from graphswap.errors import ModelLoadError

ALLOWED_KINDS = {"user_object", "variable", "function", "bare_concrete_function", "asset",
                 "constant"}
ALLOWED_USER_OBJECTS = {"_generic_user_object", "trackable_list_wrapper",
                        "trackable_dict_wrapper", "trackable_tuple_wrapper", "signature_map"}
ALLOWED_STATEFUL_OPS = {"ReadVariableOp", "StatefulPartitionedCall", "VarHandleOp", "Assert"}
FILE_READING_OPS = {"ReadFile", "MatchingFiles", "ImmutableConst", "TFRecordReaderV2",
                    "FixedLengthRecordReaderV2", "WholeFileReaderV2", "TextLineReaderV2",
                    "TFRecordDataset", "FixedLengthRecordDataset", "TextLineDataset"}


def read_saved_model_proto(path) -> saved_model_pb2.SavedModel:
    path = Path(path)
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString((path / "saved_model.pb").read_bytes())
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read saved_model.pb ({exc.strerror or exc})") \
            from None
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError: a corrupt file
        raise ModelLoadError(f"{path}: saved_model.pb is not a SavedModel protobuf ({exc}); the "
                             f"file is corrupt") from None
    if len(proto.meta_graphs) != 1:
        raise ModelLoadError(f"{path}: saved_model.pb holds {len(proto.meta_graphs)} meta graphs; "
                             f"a TensorFlow 2 SavedModel written by graphswap holds one")
    return proto


def _functions_called(attrs) -> list[str]:
    names = []
    for value in attrs.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names.extend(f.name for f in value.list.func)
    return names


def _check_op(op: str, where: str, library: dict, path) -> None:
    if op in library:
        return
    if op in FILE_READING_OPS:
        raise ModelLoadError(f"{path}: its serving graph reads files (op {op} in {where}); "
                             f"graphswap does not run such a SavedModel")
    definition = op_def_registry.get(op)
    if definition is None:
        raise ModelLoadError(f"{path}: its graph uses op {op!r} (in {where}), which this "
                             f"TensorFlow does not know; graphswap does not run it")
    if definition.is_stateful and op not in ALLOWED_STATEFUL_OPS:
        raise ModelLoadError(
            f"{path}: its serving graph runs the stateful op {op} (in {where}); a SavedModel "
            f"graphswap opens may only compute (stateless ops, variable reads, function calls), "
            f"so it is refused before anything is loaded or run")


def check_serving_graph(path) -> None:
    """Refuse (ModelLoadError naming the op or object) a SavedModel that could do more than compute
    when loaded and served; see the module docstring."""
    meta_graph = read_saved_model_proto(path).meta_graphs[0]
    for index, node in enumerate(meta_graph.object_graph_def.nodes):
        kind = node.WhichOneof("kind")
        if kind not in ALLOWED_KINDS:
            raise ModelLoadError(f"{path}: its object graph holds a {kind!r} object (node "
                                 f"{index}), which tf.saved_model.load would initialise by "
                                 f"running its functions; graphswap does not open it")
        if kind == "user_object" and node.user_object.identifier not in ALLOWED_USER_OBJECTS:
            raise ModelLoadError(f"{path}: its object graph holds a revived "
                                 f"{node.user_object.identifier!r} object (node {index}); "
                                 f"graphswap opens only the objects its own export writes")
        if node.saveable_objects or node.registered_saver:
            raise ModelLoadError(f"{path}: object graph node {index} has its own save/restore "
                                 f"functions, which tf.saved_model.load would run; graphswap does "
                                 f"not open it")
    library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    pending = []
    for node in meta_graph.object_graph_def.nodes:
        kind = node.WhichOneof("kind")
        if kind == "function":
            pending.extend(node.function.concrete_functions)
        elif kind == "bare_concrete_function":
            pending.append(node.bare_concrete_function.concrete_function_name)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        function = library.get(name)
        if function is None:
            raise ModelLoadError(f"{path}: its graph calls function {name!r}, which the "
                                 f"SavedModel does not define; the file is corrupt")
        for node in function.node_def:
            _check_op(node.op, f"function {name}", library, path)
            if node.op in library:
                pending.append(node.op)
            pending.extend(_functions_called(node.attr))
