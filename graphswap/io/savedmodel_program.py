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
  numbers, cuDNN RNNs) or of `LOOKUP_TABLE_OPS` (in-memory lookup tables: a text model's
  vocabulary).  The TensorFlow 1 saver's functions (SaveV2/RestoreV2 behind the
  `saver_def`, which TensorFlow 2's loader never calls) may also use `SAVER_OPS`, but only if no
  function reachable from the object graph or any other node calls them.
  Anything else is refused with the op(s) and the function(s) they sit in.
* `check_keras2_saved_model` adds graphswap.io.stored_code's walk of every Keras config the file carries (`keras_metadata.pb`, or the
  metadata of the object graph of a TensorFlow <= 2.4 file), at any depth - wrappers, nested
  models, layer lists - for code-carrying layers (`Lambda`, serialised Python lambdas).
* `private_copy` copies the directory into an owner-only temporary directory, so the bytes that
  were checked are the bytes that are loaded (the original may change in between) - after a
  walk (no recursion) that bounds what is copied: plain files and folders only, at most
  MAX_SAVED_MODEL_BYTES by the files' declared sizes (a sparse file counts whole), folders
  MAX_SAVED_MODEL_DEPTH deep, MAX_SAVED_MODEL_ENTRIES entries, and no more than the temporary
  folder has free.

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
    r"Lookup|Register|^Copy|Thread|Infeed|Outfeed|^DTensor|^Relayout")
#: stateless by TensorFlow's flag, yet more than computation: `Abort` ends the process (exit 0
#: with exit_without_error, else SIGABRT); `MlirPassthroughOp` runs a program stored as text that
#: no check here reads; `CustomAggregator` records statistics in the process; `Batch`/`Unbatch`
#: share batches between calls; dataset ops reached through a variant
PROCESS_OPS = frozenset({"Abort", "MlirPassthroughOp", "CustomAggregator", "Batch", "Unbatch",
                         "UnbatchGrad", "GetElementAtIndex", "GetOptions"})
#: in-memory lookup tables (the vocabularies of StringLookup / IntegerLookup / TextVectorization,
#: and the token counts their adapt() keeps): created, filled from tensors the file holds, read,
#: and saved / restored with the checkpoint's values; never a file (a table initialised from a
#: text file, InitializeTableFromTextFileV2, stays refused)
LOOKUP_TABLE_OPS = frozenset({"HashTableV2", "MutableHashTableV2", "LookupTableFindV2",
                              "LookupTableImportV2", "LookupTableExportV2", "LookupTableSizeV2",
                              "LookupTableInsertV2", "LookupTableRemoveV2", "InitializeTableV2"})
#: the TensorFlow 1 saver (`saver_def`): allowed only in functions nothing but the saver calls
SAVER_OPS = frozenset({"SaveV2", "RestoreV2", "MergeV2Checkpoints", "ShardedFilename",
                       "ShardedFilespec", "DisableCopyOnRead", "VarHandleOp"})
#: graph-level nodes (the TensorFlow 1 view: variables, inputs, the calls of signatures/saver)
GRAPH_LEVEL_OPS = frozenset({"VarHandleOp", "Placeholder", "PlaceholderWithDefault", "Const",
                             "NoOp"})
#: what graphswap's own export writes into the object graph (its check is stricter); a
#: "resource" is a lookup table of a preprocessing layer, created and filled by its functions
#: (LOOKUP_TABLE_OPS, checked like every function), saved and restored with the checkpoint
OWN_KINDS = {"user_object", "variable", "function", "bare_concrete_function", "asset", "constant",
             "resource"}
OWN_USER_OBJECTS = {"_generic_user_object", "trackable_list_wrapper", "trackable_dict_wrapper",
                    "trackable_tuple_wrapper", "signature_map"}
MAX_NAMED = 6


@functools.lru_cache(maxsize=None)
def is_pure_op(op: str) -> bool:
    """Whether `op` only computes (see the module docstring); False for ops TensorFlow lacks."""
    from tensorflow.python.framework import op_def_registry  # no public is_stateful

    if op in STATEFUL_COMPUTATION or op in LOOKUP_TABLE_OPS:
        return True
    definition = op_def_registry.get(op)
    if definition is None or definition.is_stateful or IMPURE_FAMILIES.search(op) \
            or op in PROCESS_OPS:
        return False
    return not any(arg.is_ref for arg in (*definition.input_arg, *definition.output_arg))


def _why(op: str) -> str:
    from tensorflow.python.framework import op_def_registry

    if op_def_registry.get(op) is None:
        return "not a TensorFlow op: a custom op's native library"
    if op == "Abort":
        return "ends the process"
    if op == "MlirPassthroughOp":
        return "runs a program stored as text"
    if op in ("VarHandleOp", "MutableHashTableV2", "HashTableV2", "MutableDenseHashTableV2"):
        return "creates a resource"
    if "PyFunc" in op:
        return "calls Python"
    if re.search(r"File|Save|Restore|Matching|Reader|Dataset|Immutable|Sharded|Checkpoint|"
                 r"Load|Record|Remap|Table", op):
        return "reads or writes files"
    if re.search(r"Print|Summary|Debug", op):
        return "writes output"
    if re.search(r"Send|Recv|Rpc|Collective|Host|TPU|Xla|feed|DTensor|Relayout", op):
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
            if node.saveable_objects and kind != "resource" or node.registered_saver:
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

#: the most a SavedModel graphswap opens may hold, checked before anything is copied: its files
#: together, by their declared sizes (saved_model.pb is a protocol buffer of at most 2 GiB; the
#: weights of the models graphswap rewrites are megabytes), how deep its folders nest, and its
#: files and folders in all
MAX_SAVED_MODEL_BYTES = 2 * 1024 ** 3
MAX_SAVED_MODEL_DEPTH = 32
MAX_SAVED_MODEL_ENTRIES = 10_000


def _survey(path: Path, shown) -> tuple[list[tuple[Path, bool, int]], int]:
    """Every entry below `path` as (relative path, is a folder, size), walked without recursion
    before anything is copied: plain files and folders only, at most MAX_SAVED_MODEL_DEPTH folders
    deep, MAX_SAVED_MODEL_ENTRIES entries and MAX_SAVED_MODEL_BYTES in all - by each file's
    st_size, so a sparse file counts at the size its copy would write.  Returns the entries
    (each folder before what it holds) and their total size; ModelLoadError otherwise."""
    entries: list[tuple[Path, bool, int]] = []
    total, pending = 0, [(Path(), 0)]
    while pending:
        relative, depth = pending.pop()
        try:
            listing = sorted(os.scandir(path / relative), key=lambda e: e.name)
        except OSError as exc:
            raise ModelLoadError(f"{shown}: cannot list {relative} ({exc.strerror or exc})") \
                from None
        for entry in listing:
            name = relative / entry.name
            if len(entries) >= MAX_SAVED_MODEL_ENTRIES:
                raise ModelLoadError(
                    f"{shown}: holds more than {MAX_SAVED_MODEL_ENTRIES:,} files and folders; a "
                    f"SavedModel holds a handful (saved_model.pb, variables/, assets/), so "
                    f"graphswap does not copy this one. Remove what does not belong to the model")
            if entry.is_dir(follow_symlinks=False):
                if depth >= MAX_SAVED_MODEL_DEPTH:
                    raise ModelLoadError(
                        f"{shown}: its folders nest more than {MAX_SAVED_MODEL_DEPTH} deep "
                        f"({str(name)[:120]}...); a SavedModel's folders (variables/, assets/) "
                        f"are a level or two deep, so graphswap does not copy this one. Remove "
                        f"the nested folders")
                entries.append((name, True, 0))
                pending.append((name, depth + 1))
            elif entry.is_file(follow_symlinks=False):
                size = entry.stat(follow_symlinks=False).st_size
                total += size
                if total > MAX_SAVED_MODEL_BYTES:
                    raise ModelLoadError(
                        f"{shown}: its files hold more than {MAX_SAVED_MODEL_BYTES:,} bytes "
                        f"({name} alone declares {size:,}); graphswap copies a SavedModel before "
                        f"it checks it and copies at most that much (a model it rewrites is "
                        f"megabytes; saved_model.pb can hold at most 2 GiB): a file this large - "
                        f"or a sparse one - would fill the disk. Remove what does not belong to "
                        f"the model, or check where the directory came from")
                entries.append((name, False, size))
            else:
                raise ModelLoadError(
                    f"{shown}: {name} is not a plain file or folder (a link?); a SavedModel "
                    f"graphswap opens holds only plain files. Copy the directory with its files "
                    f"resolved")
    return entries, total


def _copy_file(source: Path, target: Path, shown, size: int) -> None:
    """Copy at most the `size` bytes the survey saw (a file growing meanwhile is refused)."""
    try:
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError as exc:
        raise ModelLoadError(f"{shown}: cannot read {source.name} ({exc.strerror or exc}); the "
                             f"SavedModel must hold plain files, not links") from None
    with os.fdopen(fd, "rb") as reader:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            raise ModelLoadError(f"{shown}: {source.name} is not a plain file")
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(out, "wb") as writer:
            left = size
            while True:
                block = reader.read(min(1 << 20, left + 1))
                if not block:
                    break
                left -= len(block)
                if left < 0:
                    raise ModelLoadError(f"{shown}: {source.name} grew while it was copied; "
                                         f"open the SavedModel once nothing writes to it")
                writer.write(block)


def _copy_name(path: Path) -> str:
    """The copy's folder name: the original's, unless empty or not UTF-8 (TensorFlow opens only
    UTF-8 paths; messages name the original anyway)."""
    try:
        path.name.encode("utf-8")
    except UnicodeEncodeError:
        return "savedmodel"
    return path.name or "savedmodel"


@contextlib.contextmanager
def private_copy(path):
    """The SavedModel directory `path` copied, file by file, into a fresh owner-only (0700)
    temporary directory, removed afterwards: check and load the copy, and the bytes checked are
    the bytes loaded.  What it holds is surveyed first (_survey: sizes, depth, entries) and its
    total must fit the temporary folder's free space."""
    path = Path(path)
    entries, total = _survey(path, path)
    with tempfile.TemporaryDirectory(prefix="graphswap-savedmodel-") as scratch:
        os.chmod(scratch, 0o700)
        free = shutil.disk_usage(scratch).free
        if total > free:
            raise ModelLoadError(
                f"{path}: its files hold {total:,} bytes, and graphswap opens a private copy of "
                f"them in {os.path.dirname(scratch)}, which has {free:,} bytes free; free some "
                f"space there, or set TMPDIR to a folder with room")
        copy = Path(scratch) / _copy_name(path)
        os.mkdir(copy, 0o700)
        try:
            for name, is_folder, size in entries:
                if is_folder:
                    os.mkdir(copy / name, 0o700)
                else:
                    _copy_file(path / name, copy / name, path, size)
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
