"""A SavedModel is a program: what one may run before graphswap lets TensorFlow or tf_keras read it.

`tf.saved_model.load` (and tf_keras' `load_model`, which calls it) runs functions stored in the
file while it loads: the initialisers of tracked resources (`_create_resource`, `_initialize`), the
save/restore functions of saveable objects, and then every traced call of the model when it is
run.  A stored function may write files, list directories, print, call back into Python or load
native code, so a Keras 2 SavedModel or a graphswap SavedModel is checked here, from its bytes,
before either library sees it:

* `check_program` parses `saved_model.pb` itself and walks every MetaGraph: every graph-level
  node and every function of the function library (initialisers, restore functions, nested
  functions, functions named in attributes: While body/cond, If branches, PartitionedCall f).
  Every op must be pure computation (`is_pure_op`): an op TensorFlow marks stateless with no
  reference-typed arguments, outside the families that touch files, processes, the network or the
  debugger (`IMPURE_FAMILIES`), or one of `STATEFUL_COMPUTATION` (variable reads and in-place
  updates of the model's own variables, function calls and control flow, assertions, random
  numbers, cuDNN RNNs).  The TensorFlow 1 saver's functions (SaveV2/RestoreV2 behind the
  `saver_def`, which TensorFlow 2's loader never calls) may also use `SAVER_OPS`, but only if no
  function reachable from the object graph or any other node calls them.
  Anything else is refused with the op(s) and the function(s) they sit in.
* `check_keras2_saved_model` adds graphswap.io.stored_code's walk of every Keras config the file carries (`keras_metadata.pb`, or the
  metadata of the object graph of a TensorFlow <= 2.4 file), at any depth - wrappers, nested
  models, layer lists - for code-carrying layers (`Lambda`, serialised Python lambdas).
* `private_copy` copies the directory into an owner-only temporary directory, so the bytes that
  were checked are the bytes that are loaded (the original may change in between).

`safe_mode=False` (CLI `--unsafe`) skips the two checks: only for files whose author you trust.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from graphswap.errors import ModelLoadError
from graphswap.io.stored_code import (check_keras_configs, keras_metadata_documents,
                                       object_graph_documents)

KERAS_METADATA = "keras_metadata.pb"
SAVED_MODEL = "saved_model.pb"

#: stateful ops that only compute: the model's variables (reads, and the in-place updates of
#: BatchNormalization's moving statistics in a traced training call), calls and control flow
#: (their functions are walked too), assertions, random numbers (Dropout), cuDNN's RNN kernels
STATEFUL_COMPUTATION = frozenset({
    "ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape", "VarIsInitializedOp",
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "StatefulPartitionedCall", "While", "If", "Case", "Assert",
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "RandomShuffle", "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulRandomBinomial",
    "RngReadAndSkip", "RngSkip", "NonDeterministicInts",
    "CudnnRNN", "CudnnRNNV2", "CudnnRNNV3", "CudnnRNNBackprop", "CudnnRNNBackpropV2",
    "CudnnRNNBackpropV3", "CudnnRNNParamsSize", "CudnnRNNParamsToCanonical",
    "CudnnRNNParamsToCanonicalV2", "CudnnRNNCanonicalToParams", "CudnnRNNCanonicalToParamsV2",
})
#: stateless by TensorFlow's flag, but reading files, running Python, holding queues, writing
#: summaries or debug streams, or talking to other processes/devices: never pure computation
IMPURE_FAMILIES = re.compile(
    r"File|Reader|Dataset|Iterator|Queue|Barrier|Accumulator|^Stack|TensorArray|Summary|Debug|"
    r"PyFunc|Immutable|Print|Matching|Save|Restore|Sharded|Checkpoint|Remap|Snapshot|Load|"
    r"Record|Collective|Send|Recv|Host|Rpc|Sleep|^TPU|^Tpu|^Xla|^_|BatchFunction|Proto|Table|"
    r"Lookup|Register|^Copy|Thread")
#: the TensorFlow 1 saver (`saver_def`): allowed only in functions nothing but the saver calls
SAVER_OPS = frozenset({"SaveV2", "RestoreV2", "MergeV2Checkpoints", "ShardedFilename",
                       "ShardedFilespec", "DisableCopyOnRead", "VarHandleOp"})
#: graph-level nodes (the TensorFlow 1 view: variables, inputs, the calls of signatures/saver)
GRAPH_LEVEL_OPS = frozenset({"VarHandleOp", "Placeholder", "PlaceholderWithDefault", "Const",
                             "NoOp"})
#: what graphswap's own export writes into the object graph (its check is stricter)
OWN_KINDS = {"user_object", "variable", "function", "bare_concrete_function", "asset", "constant"}
OWN_USER_OBJECTS = {"_generic_user_object", "trackable_list_wrapper", "trackable_dict_wrapper",
                    "trackable_tuple_wrapper", "signature_map"}
MAX_NAMED = 6


@functools.lru_cache(maxsize=None)
def is_pure_op(op: str) -> bool:
    """Whether `op` only computes (see the module docstring); False for ops TensorFlow lacks."""
    from tensorflow.python.framework import op_def_registry  # no public is_stateful

    if op in STATEFUL_COMPUTATION:
        return True
    definition = op_def_registry.get(op)
    if definition is None or definition.is_stateful or IMPURE_FAMILIES.search(op):
        return False
    return not any(arg.is_ref for arg in (*definition.input_arg, *definition.output_arg))


def _why(op: str) -> str:
    from tensorflow.python.framework import op_def_registry

    if op_def_registry.get(op) is None:
        return "not a TensorFlow op: a custom op's native library"
    if op in ("VarHandleOp", "MutableHashTableV2", "HashTableV2", "MutableDenseHashTableV2"):
        return "creates a resource"
    if "PyFunc" in op:
        return "calls Python"
    if re.search(r"File|Save|Restore|Matching|Reader|Dataset|Immutable|Sharded|Checkpoint|"
                 r"Load|Record|Remap|Table", op):
        return "reads or writes files"
    if re.search(r"Print|Summary|Debug", op):
        return "writes output"
    if re.search(r"Send|Recv|Rpc|Collective|Host|TPU|Xla", op):
        return "talks to other devices or processes"
    return "side effects"


def read_saved_model(path, shown=None):
    """The SavedModel protobuf of directory `path`, parsed by graphswap (ModelLoadError if not)."""
    from tensorflow.core.protobuf import saved_model_pb2

    shown = shown or path
    proto = saved_model_pb2.SavedModel()
    try:
        data = (Path(path) / SAVED_MODEL).read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"{shown}: cannot read {SAVED_MODEL} ({exc.strerror or exc})") \
            from None
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError: a corrupt file
        raise ModelLoadError(f"{shown}: {SAVED_MODEL} is not a SavedModel protobuf ({exc}); the "
                             f"file is corrupt") from None
    if not proto.meta_graphs:
        raise ModelLoadError(f"{shown}: {SAVED_MODEL} holds no meta graph; the file is corrupt")
    return proto


def _called(node, library) -> list[str]:
    """Functions a NodeDef calls: its op when that names a library function, and every function
    named in its attributes (While body/cond, If branches, PartitionedCall f, ...)."""
    names = [node.op] if node.op in library else []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names.extend(f.name for f in value.list.func)
    return names


def _closure(roots, library) -> set[str]:
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        for node in library[name].node_def:
            pending.extend(_called(node, library))
    return seen


def _object_graph_functions(meta_graph) -> list[str]:
    names = []
    for node in meta_graph.object_graph_def.nodes:
        kind = node.WhichOneof("kind")
        if kind == "function":
            names.extend(node.function.concrete_functions)
        elif kind == "bare_concrete_function":
            names.append(node.bare_concrete_function.concrete_function_name)
    return names


def program_findings(proto) -> list[tuple[str, str]]:
    """(op, where) for every op in `proto` that is not pure computation (module docstring)."""
    findings: list[tuple[str, str]] = []
    for index, meta_graph in enumerate(proto.meta_graphs):
        graph = meta_graph.graph_def
        library = {f.signature.name: f for f in graph.library.function}
        saver = meta_graph.saver_def
        saver_nodes = {name.split(":")[0] for name in (saver.save_tensor_name,
                                                       saver.restore_op_name) if name}
        saver_roots, other_roots = [], list(_object_graph_functions(meta_graph))
        prefix = f"meta graph {index}, " if len(proto.meta_graphs) > 1 else ""
        for node in graph.node:
            called = _called(node, library)
            (saver_roots if node.name in saver_nodes else other_roots).extend(called)
            if not (node.op in library or node.op in GRAPH_LEVEL_OPS or is_pure_op(node.op)):
                findings.append((node.op, f"{prefix}graph node {node.name}"))
        for name in (*saver_roots, *other_roots):
            if name not in library:
                raise ModelLoadError(f"its graph calls function {name!r}, which the SavedModel "
                                     f"does not define; the file is corrupt")
        loaded = _closure(other_roots, library)
        saver_only = _closure(saver_roots, library) - loaded
        for name, function in library.items():
            extra = SAVER_OPS if name in saver_only else frozenset()
            for node in function.node_def:
                if node.op in library or node.op in extra or is_pure_op(node.op):
                    continue
                findings.append((node.op, f"{prefix}function {name}"))
    return findings


def _own_export_objects(proto, shown) -> None:
    """graphswap's own export: only the objects it writes (no resources, no saveable objects)."""
    for meta_graph in proto.meta_graphs:
        for index, node in enumerate(meta_graph.object_graph_def.nodes):
            kind = node.WhichOneof("kind")
            if kind not in OWN_KINDS:
                raise ModelLoadError(f"{shown}: its object graph holds a {kind!r} object (node "
                                     f"{index}), which tf.saved_model.load would initialise by "
                                     f"running its functions; graphswap does not open it")
            if kind == "user_object" and node.user_object.identifier not in OWN_USER_OBJECTS:
                raise ModelLoadError(f"{shown}: its object graph holds a revived "
                                     f"{node.user_object.identifier!r} object (node {index}); "
                                     f"graphswap opens only the objects its own export writes")
            if node.saveable_objects or node.registered_saver:
                raise ModelLoadError(f"{shown}: object graph node {index} has its own "
                                     f"save/restore functions, which tf.saved_model.load would "
                                     f"run; graphswap does not open it")


def check_program(path, shown=None, own_export: bool = False):
    """Refuse (ModelLoadError naming the ops, the functions they sit in, and `--unsafe`) the
    SavedModel directory `path` unless every op it holds is pure computation; with `own_export`,
    also anything graphswap's export does not write.  Returns the parsed protobuf."""
    shown = shown or path
    proto = read_saved_model(path, shown)
    if own_export:
        _own_export_objects(proto, shown)
    try:
        findings = program_findings(proto)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{shown}: {exc}") from None
    if findings:
        by_place: dict[str, list[str]] = {}
        for op, where in findings:
            ops = by_place.setdefault(where, [])
            if op not in ops:
                ops.append(op)
        places = list(by_place.items())
        named = "; ".join(f"{', '.join(f'{op} ({_why(op)})' for op in ops)} in {where}"
                          for where, ops in places[:MAX_NAMED])
        more = f"; and {len(places) - MAX_NAMED} more place(s)" if len(places) > MAX_NAMED else ""
        raise ModelLoadError(
            f"{shown}: a SavedModel is a program, and this one holds op(s) that do more than "
            f"compute: {named}{more}. TensorFlow runs such functions while it loads the file "
            f"(resource initialisers, restore functions) or when the model is called, so the "
            f"SavedModel is refused before anything is loaded or run. Load it with --unsafe "
            f"(safe_mode=False) only if you trust the file's author")
    return proto


# ---------------------------------------------------------------------------------------------
# the private copy
# ---------------------------------------------------------------------------------------------

def _copy_file(source: Path, target: Path, shown) -> None:
    try:
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ModelLoadError(f"{shown}: cannot read {source.name} ({exc.strerror or exc}); the "
                             f"SavedModel must hold plain files, not links") from None
    with os.fdopen(fd, "rb") as reader:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            raise ModelLoadError(f"{shown}: {source.name} is not a plain file")
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(out, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)


def _copy_tree(source: Path, target: Path, shown) -> None:
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        destination = target / entry.name
        if entry.is_dir(follow_symlinks=False):
            os.mkdir(destination, 0o700)
            _copy_tree(Path(entry.path), destination, shown)
        elif entry.is_file(follow_symlinks=False):
            _copy_file(Path(entry.path), destination, shown)
        else:
            raise ModelLoadError(f"{shown}: {Path(entry.path).relative_to(shown)} is not a plain "
                                 f"file or folder (a link?); a SavedModel graphswap opens holds "
                                 f"only plain files. Copy the directory with its files resolved")


@contextlib.contextmanager
def private_copy(path):
    """The SavedModel directory `path` copied, file by file, into a fresh owner-only (0700)
    temporary directory, removed afterwards: check and load the copy, and the bytes checked are
    the bytes loaded."""
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="graphswap-savedmodel-") as scratch:
        os.chmod(scratch, 0o700)
        copy = Path(scratch) / (path.name or "savedmodel")
        os.mkdir(copy, 0o700)
        try:
            _copy_tree(path, copy, path)
        except OSError as exc:
            raise ModelLoadError(f"{path}: cannot copy the SavedModel to a private directory "
                                 f"({exc.strerror or exc})") from None
        yield copy


def shown_as(exc: Exception, copy, original) -> Exception:
    """`exc` of the same type with the private copy's path replaced by the original's."""
    try:
        return type(exc)(str(exc).replace(str(copy), str(original)))
    except Exception:  # noqa: BLE001 - an error type with another constructor: keep it as is
        return exc


def check_keras2_saved_model(path, shown=None, safe_mode: bool = True) -> None:
    """In safe mode, refuse the Keras 2 SavedModel directory `path` if its program does more
    than compute (`check_program`) or its Keras configs hold Python code at any depth
    (`check_keras_configs`: keras_metadata.pb, or the object graph's metadata of TF <= 2.4)."""
    if not safe_mode:
        return
    shown = shown or path
    proto = check_program(path, shown)
    documents = object_graph_documents(proto)
    metadata = Path(path) / KERAS_METADATA
    if metadata.is_file():
        try:
            data = metadata.read_bytes()
        except OSError as exc:
            raise ModelLoadError(f"{shown}: cannot read {KERAS_METADATA} "
                                 f"({exc.strerror or exc})") from None
        documents.extend(keras_metadata_documents(data, shown))
    check_keras_configs(documents, shown)
