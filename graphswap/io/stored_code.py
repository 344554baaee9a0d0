"""Python code stored in Keras configs: found at any depth before Keras or tf_keras rebuilds a model.

A `Lambda` layer's config carries bytecode (Keras 2: `function` with `function_type: "lambda"`;
Keras 3: a serialised `__lambda__`), and a layer's output shape can be bytecode too.  Rebuilding
such a config runs the code, and wrappers (`TimeDistributed`, `Bidirectional`), nested models,
`Sequential` inside layers and custom layers' layer lists rebuild what they hold, so a check of
each saved object's top-level class name misses a Lambda one level down (or one whose own
metadata node was renamed).  `code_carrying_layers` walks a whole config; `check_keras_configs`
refuses what it finds.  `keras_metadata_documents` parses a Keras 2 SavedModel's
`keras_metadata.pb` here (three protobuf fields), so nothing of tf_keras runs before the check;
`object_graph_documents` reads the metadata TensorFlow <= 2.4 kept in the object graph.
"""

from __future__ import annotations

import json

from graphswap.errors import ModelLoadError
from graphswap.input_files import MAX_MODEL_JSON_DEPTH, load_json

KERAS_METADATA = "keras_metadata.pb"
#: class names of Keras layers/objects that carry Python code
CODE_CLASSES = {"Lambda", "__lambda__"}
MAX_NAMED = 6


def _label(document: dict) -> str:
    config = document.get("config")
    name = config.get("name") if isinstance(config, dict) else None
    name = name if name is not None else document.get("name")
    cls = document.get("class_name")
    return f"{cls} {name!r}" if name is not None else str(cls)


def code_carrying_layers(document, trail: tuple = ()) -> list[str]:
    """Where `document` (a Keras config, any nesting of dicts and lists) holds Python code: a
    `Lambda` layer, a serialised lambda (`__lambda__`), or a function/output shape stored as
    bytecode (`function_type`/`output_shape_type` "lambda").  Each as 'Lambda 'x' (inside
    TimeDistributed 'td')'."""
    found: list[str] = []
    if isinstance(document, dict):
        cls = document.get("class_name")
        code = (cls in CODE_CLASSES or document.get("function_type") == "lambda"
                or document.get("output_shape_type") == "lambda")
        here = trail
        if isinstance(cls, str) and cls:
            label = _label(document)
            if code:
                inside = f" (inside {' > '.join(trail)})" if trail else ""
                found.append(f"{label}{inside}")
            if not trail or trail[-1] != label:
                here = (*trail, label)
        elif code and not (trail and trail[-1].split(" ")[0] in CODE_CLASSES):
            found.append(f"a function stored as bytecode (inside "
                         f"{' > '.join(trail) or 'the model'})")
        for value in document.values():
            found.extend(code_carrying_layers(value, here))
    elif isinstance(document, list):
        for value in document:
            found.extend(code_carrying_layers(value, trail))
    return found


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ModelLoadError("a truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes):
    """(field number, value) of a protobuf message; length-delimited values as bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ModelLoadError("a truncated field")
            value, pos = data[pos:pos + size], pos + size
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ModelLoadError(f"an unknown wire type {wire}")
        yield number, value


def keras_metadata_documents(data: bytes, shown) -> list[tuple[str, object]]:
    """(node path, JSON document) of every node of a `keras_metadata.pb` (tf_keras'
    SavedMetadata: field 1 the nodes; a node's field 3 its path, field 5 its JSON metadata),
    parsed here so that nothing of tf_keras runs before the check."""
    documents = []
    try:
        for number, node in _fields(data):
            if number != 1 or not isinstance(node, bytes):
                continue
            node_path, metadata = "", None
            for field, value in _fields(node):
                if field == 3 and isinstance(value, bytes):
                    node_path = value.decode("utf-8", "replace")
                elif field == 5 and isinstance(value, bytes):
                    metadata = value.decode("utf-8")
            if metadata:
                documents.append((node_path, load_json(metadata, f"node {node_path!r}'s metadata",
                                                       ModelLoadError, MAX_MODEL_JSON_DEPTH)))
    except (ModelLoadError, ValueError) as exc:  # ValueError: JSON, UTF-8
        raise ModelLoadError(f"{shown}: {KERAS_METADATA} is not readable ({exc}); the file is "
                             f"corrupt") from None
    return documents


def object_graph_documents(proto) -> list[tuple[str, object]]:
    """(node, JSON document) of the Keras metadata a TensorFlow <= 2.4 file keeps in its object
    graph (user objects' `metadata`)."""
    documents = []
    for meta_graph in proto.meta_graphs:
        for index, node in enumerate(meta_graph.object_graph_def.nodes):
            if node.WhichOneof("kind") == "user_object" and node.user_object.metadata:
                try:
                    documents.append((f"node {index}", load_json(
                        node.user_object.metadata, f"the object graph's node {index}",
                        ModelLoadError, MAX_MODEL_JSON_DEPTH)))
                except json.JSONDecodeError:
                    continue
    return documents


def check_keras_configs(documents, shown) -> None:
    """Refuse (ModelLoadError) Keras configs that hold Python code at any depth."""
    found: dict[str, str] = {}
    for _, document in documents:
        for where in code_carrying_layers(document):
            found.setdefault(where.split(" (inside ")[0], where)
    found = list(found.values())
    if found:
        raise ModelLoadError(
            f"cannot load model {shown}: it contains a Lambda layer or other stored Python code "
            f"({'; '.join(found[:MAX_NAMED])}), whose code would be deserialised and run. Load it "
            f"only if you trust the file, with safe_mode=False (CLI: --unsafe)")
