"""graphswap SavedModels: one directory that serves without graphswap and reopens in graphswap.

    NAME_savedmodel/
      saved_model.pb, variables/        serving_default: the model with its swapped layers lowered
                                        (standard TensorFlow ops, exact float32; see savedmodel.py)
      assets/graphswap_kernels.json     the export metadata (which layer ran which kernel)
      assets/graphswap/model.keras      the rewritten Keras model itself: architecture, weights,
                                        optimizer state, the kernel records of its swapped layers
      assets/graphswap/manifest.json    ties the two together (format version, the lowered layers
                                        and their kernel records, the embedded model's SHA-256,
                                        the signature's names, the sample batch of the check)

All of it is read from a private owner-only copy of the directory, taken first, so the bytes
checked are the bytes loaded (savedmodel_program.private_copy).

`embed_model` writes the graphswap half into a SavedModel being exported; `load_dual_saved_model`
opens such a directory as the Keras model, after checking that its halves agree:

1. the manifest is readable and of a known format version, and every file it needs is present;
2. the embedded model's bytes (read once) have the SHA-256 the manifest records;
3. the model is loaded from a private copy of exactly those bytes, through Keras and so through
   the trust gate (kernels.open_record) like any model file - the directory never adds trust;
4. its swapped layers, their kernel records and backward modes, and its input/output names are the
   manifest's (and the export metadata's);
5. the serving graph passes graphswap.io.savedmodel_program (it may only compute; skipped with
   safe_mode=False);
6. before anything of it is run, its `serving_default` is, op for op and weight for weight, what
   this graphswap exports from the embedded model (graphswap.io.savedmodel_serving: the export is
   redone in a private temporary directory and both are compared as data) - a graph that answers
   differently only on some inputs (an exact 0.0, say) passes no check of a sample batch, so none
   is trusted alone;
7. its `serving_default` outputs equal the embedded model's lowered outputs on the manifest's
   sample batch (swap.sample_inputs) to `RELATIVE_TOLERANCE` of the outputs' scale.

Any disagreement is a SavedModelConsistencyError naming the halves that disagree.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from graphswap._version import __version__
from graphswap.errors import (ExportError, GraphswapError, ModelLoadError,
                              SavedModelConsistencyError)
from graphswap.io.export_result import ASSET_NAME
from graphswap.io.keras3 import MAX_ARCHIVE_JSON_BYTES, check_archive_members, load_keras_file
from graphswap.io.lowering import lower_model, swapped_layers
from graphswap.io.savedmodel_program import check_program, private_copy, shown_as
from graphswap.io.savedmodel_serving import differences, reference_form, serving_form
from graphswap.io.signatures import signature_names
from graphswap.swap import MAX_SEQUENCE_LENGTH, compare_outputs, run_model, sample_inputs
from graphswap.input_files import load_json

EMBED_DIR = "graphswap"
MODEL_FILE = "model.keras"
MANIFEST_FILE = "manifest.json"
FORMAT = "graphswap-savedmodel"
FORMAT_VERSION = 1
SIGNATURE = "serving_default"
CHECK_SEED = 0
MAX_CHECK_BATCH = 256
#: largest |serving - embedded model lowered| accepted, relative to the outputs' scale (as the
#: export's own verification)
RELATIVE_TOLERANCE = 1e-4


def embedded_dir(path) -> Path:
    return Path(path) / "assets" / EMBED_DIR


def is_graphswap_saved_model(path) -> bool:
    """Whether `path` is a SavedModel directory graphswap wrote (recognised by its assets:
    assets/graphswap/ or assets/graphswap_kernels.json), complete or not."""
    path = Path(path)
    return path.is_dir() and (embedded_dir(path).exists()
                              or (path / "assets" / ASSET_NAME).is_file())


def _layer_keys(records) -> list[dict]:
    """What must agree between the manifest, the export metadata and the embedded model, per
    lowered layer (sorted by layer path: the traversal orders of lowering and listing differ)."""
    keys = [{"layer": r.get("layer"), "type": r.get("type"), "kernel": r.get("kernel"),
             "backward": r.get("backward")} for r in records]
    return sorted(keys, key=lambda k: str(k["layer"]))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_document(records, input_names, output_names, model_name: str, model_bytes: bytes,
                      check_batch: int, sequence_length=None) -> dict:
    check = {"batch": int(check_batch), "seed": CHECK_SEED,
             "compares": f"{SIGNATURE} with the embedded model, swapped layers lowered, on "
                         f"graphswap.swap.sample_inputs(model, batch, seed, sequence_length)"}
    if sequence_length is not None:   # free input dimensions' length (absent: the default)
        check["sequence_length"] = int(sequence_length)
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "producer": "graphswap",
            "graphswap_version": __version__,
            "model": {"file": MODEL_FILE, "name": model_name, "sha256": _sha256(model_bytes),
                      "bytes": len(model_bytes)},
            "signature": {"name": SIGNATURE, "inputs": list(input_names),
                          "outputs": list(output_names)},
            "lowered_layers": _layer_keys(r.to_dict() for r in records),
            "consistency_check": check}


def embed_model(model, directory, records, input_names, output_names, check_batch: int,
                sequence_length=None) -> dict:
    """Write the graphswap half into the SavedModel being exported at `directory` (a temporary
    directory the export renames into place): assets/graphswap/model.keras and its manifest."""
    target = embedded_dir(directory)
    target.mkdir(parents=True, exist_ok=True)
    model_path = target / MODEL_FILE
    try:
        model.save(model_path)
    except Exception as exc:  # noqa: BLE001 - Keras raises many types; one clear line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"cannot embed the Keras model in the SavedModel (model.save failed: "
                          f"{type(exc).__name__}: {first}); nothing was written") from None
    manifest = manifest_document(records, input_names, output_names, model.name,
                                 model_path.read_bytes(), check_batch, sequence_length)
    (target / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True),
                                        encoding="utf-8")
    return manifest


def _missing(path: Path, what: str) -> ModelLoadError:
    return ModelLoadError(
        f"{path} is a graphswap SavedModel with a missing part: {what} is missing (the directory "
        f"was copied incompletely or edited). Re-export it from the model it came from (graphswap "
        f"export MODEL --format savedmodel), or use that model file directly")


def read_manifest(path) -> dict:
    """The manifest of the graphswap SavedModel at `path` (ModelLoadError if missing/unreadable)."""
    path = Path(path)
    manifest_path = embedded_dir(path) / MANIFEST_FILE
    if not embedded_dir(path).exists():
        raise ModelLoadError(
            f"{path} is an inference-only SavedModel exported by graphswap without the embedded "
            f"Keras model (assets/{EMBED_DIR}/ is missing: written by an older graphswap, or the "
            f"folder was deleted); graphswap needs the layers. Re-export it with this graphswap "
            f"(graphswap export MODEL --format savedmodel), or use the .keras it was exported from")
    if not manifest_path.is_file():
        raise _missing(path, f"assets/{EMBED_DIR}/{MANIFEST_FILE}")
    try:
        manifest = load_json(read_bounded(manifest_path, path, f"assets/{EMBED_DIR}/"
                                                               f"{MANIFEST_FILE}"),
                             f"{path}: the manifest assets/{EMBED_DIR}/{MANIFEST_FILE}",
                             SavedModelConsistencyError)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SavedModelConsistencyError(
            f"{path}: the manifest assets/{EMBED_DIR}/{MANIFEST_FILE} is not readable JSON "
            f"({exc}); it was edited or damaged. Re-export the directory") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SavedModelConsistencyError(
            f"{path}: assets/{EMBED_DIR}/{MANIFEST_FILE} is not a graphswap SavedModel manifest "
            f"(format {manifest.get('format') if isinstance(manifest, dict) else None!r}, "
            f"expected {FORMAT!r}); it was edited or replaced. Re-export the directory")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelLoadError(
            f"{path}: manifest format version {version!r}; this graphswap ({__version__}) reads "
            f"version {FORMAT_VERSION}. Open it with the graphswap that wrote it "
            f"({manifest.get('graphswap_version', 'unknown')}), or re-export it")
    return manifest


def read_bounded(file: Path, path: Path, shown: str) -> str:
    """The UTF-8 text of the JSON file `file` of the SavedModel `path`, read only if it holds at
    most MAX_ARCHIVE_JSON_BYTES (the limit of a .keras archive's config): a manifest of gigabytes,
    sparse or not, is refused before it is read (ModelLoadError)."""
    with open(file, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        data = handle.read(MAX_ARCHIVE_JSON_BYTES + 1) if size <= MAX_ARCHIVE_JSON_BYTES else b""
    if size > MAX_ARCHIVE_JSON_BYTES or len(data) > MAX_ARCHIVE_JSON_BYTES:
        raise ModelLoadError(
            f"{path}: {shown} holds {max(size, len(data)):,} bytes, more than the "
            f"{MAX_ARCHIVE_JSON_BYTES:,} graphswap reads of a JSON file in a model (graphswap "
            f"writes kilobytes there); it was edited or replaced. Re-export the directory")
    return data.decode("utf-8")


def _manifest_field(manifest: dict, path: Path, *keys):
    value = manifest
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise SavedModelConsistencyError(
                f"{path}: the manifest has no {'.'.join(keys)}; it was edited. Re-export the "
                f"directory")
        value = value[key]
    return value


def _check_batch(manifest: dict, path: Path) -> int:
    batch = _manifest_field(manifest, path, "consistency_check", "batch")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_CHECK_BATCH:
        raise SavedModelConsistencyError(
            f"{path}: the manifest's consistency_check.batch is {batch!r}; it must be a whole "
            f"number 1..{MAX_CHECK_BATCH} (the check cannot be skipped). Re-export the directory")
    return batch


def _check_length(manifest: dict, path: Path):
    """The manifest's length of free input dimensions (None: absent, the default)."""
    length = (manifest.get("consistency_check") or {}).get("sequence_length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int)
                               or not 1 <= length <= MAX_SEQUENCE_LENGTH):
        raise SavedModelConsistencyError(
            f"{path}: the manifest's consistency_check.sequence_length is {length!r}; it must be "
            f"a whole number 1..{MAX_SEQUENCE_LENGTH}. Re-export the directory")
    return length


def load_dual_saved_model(path, custom_objects=None, safe_mode: bool = True,
                          compile: bool = True):  # noqa: A002
    """Open the graphswap SavedModel at `path` as its embedded Keras model, after the checks in the
    module docstring.  Raises ModelLoadError (a missing part, a newer format),
    SavedModelConsistencyError (halves that disagree) or the trust gate's KernelTrustError.

    Everything is read from a private owner-only copy of the directory (savedmodel_program), so
    what is checked is what is loaded; messages name the original directory."""
    path = Path(path)
    read_manifest(path)  # the older-graphswap / missing-part messages before anything is copied
    with private_copy(path) as copy:
        try:
            return _load_copy(copy, custom_objects, safe_mode, compile)
        except GraphswapError as exc:
            raise shown_as(exc, copy, path) from None


def _load_copy(path: Path, custom_objects, safe_mode, compile):  # noqa: A002
    manifest = read_manifest(path)
    model_file = embedded_dir(path) / MODEL_FILE
    for part, what in ((model_file, f"assets/{EMBED_DIR}/{MODEL_FILE} (the embedded model)"),
                       (path / "saved_model.pb", "saved_model.pb (the serving graph)"),
                       (path / "variables", "variables/ (the serving weights)"),
                       (path / "assets" / ASSET_NAME, f"assets/{ASSET_NAME} (the metadata)")):
        if not part.exists():
            raise _missing(path, what)
    try:
        data = model_file.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read assets/{EMBED_DIR}/{MODEL_FILE} "
                             f"({exc.strerror or exc})") from None
    recorded = _manifest_field(manifest, path, "model", "sha256")
    if _sha256(data) != recorded:
        raise SavedModelConsistencyError(
            f"{path}: the embedded model assets/{EMBED_DIR}/{MODEL_FILE} has SHA-256 "
            f"{_sha256(data)[:16]}..., the manifest records {str(recorded)[:16]}...: the embedded "
            f"model was replaced or edited (or the manifest was). Re-export the directory from "
            f"the model you trust")
    model = _load_private_copy(path, data, custom_objects, safe_mode, compile)
    _check_layers(path, manifest, model)
    _check_serving(path, manifest, model, safe_mode)
    return model


def _load_private_copy(path: Path, data: bytes, custom_objects, safe_mode, compile):
    """Load the model from a private copy of the bytes that were hashed (the file in the directory
    may change between the check and the load)."""
    shown = f"{path}/assets/{EMBED_DIR}/{MODEL_FILE}"
    with tempfile.TemporaryDirectory(prefix="graphswap-savedmodel-") as scratch:
        copy = Path(scratch) / MODEL_FILE
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        try:
            check_archive_members(copy)   # its config is bounded as a .keras file's
            return load_keras_file(copy, custom_objects, safe_mode, compile)
        except ModelLoadError as exc:
            raise ModelLoadError(str(exc).replace(str(copy), shown)) from None


def _check_layers(path: Path, manifest: dict, model) -> None:
    """The embedded model's swapped layers and names are the manifest's and the metadata's."""
    actual = _layer_keys(r.to_dict() for r in swapped_layers(model))
    recorded = _manifest_field(manifest, path, "lowered_layers")
    if not isinstance(recorded, list) or actual != recorded:
        raise SavedModelConsistencyError(
            f"{path}: the manifest's lowered layers disagree with the embedded model's swapped "
            f"layers ({_first_difference(recorded, actual)}): the manifest or the model was edited. "
            f"Re-export the directory from the model you trust")
    try:
        metadata = load_json(read_bounded(path / "assets" / ASSET_NAME, path,
                                          f"assets/{ASSET_NAME}"),
                             f"{path}: assets/{ASSET_NAME}", SavedModelConsistencyError)
        exported = _layer_keys(metadata["swapped_layers"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        exported = None
    if exported != actual:
        raise SavedModelConsistencyError(
            f"{path}: the export metadata assets/{ASSET_NAME} disagrees with the embedded model "
            f"({_first_difference(exported, actual)}); it was edited. Re-export the directory")
    inputs, outputs = signature_names(model)
    names = {"inputs": _manifest_field(manifest, path, "signature", "inputs"),
             "outputs": _manifest_field(manifest, path, "signature", "outputs")}
    if names != {"inputs": inputs, "outputs": outputs}:
        raise SavedModelConsistencyError(
            f"{path}: the manifest names inputs {names['inputs']} and outputs {names['outputs']}, "
            f"the embedded model {inputs} and {outputs}; one of them was edited. Re-export the "
            f"directory")


def _first_difference(recorded, actual) -> str:
    if not isinstance(recorded, list):
        return f"recorded {type(recorded).__name__}, expected a list of layers"
    for index, (want, have) in enumerate(zip(recorded, actual)):
        if want != have:
            layer = have.get("layer")
            for key in ("layer", "type", "kernel", "backward"):
                if not isinstance(want, dict) or want.get(key) != have.get(key):
                    shown = want.get(key) if isinstance(want, dict) else want
                    return (f"layer {index} ({layer}): recorded {key} {json.dumps(shown)}, the "
                            f"embedded model has {json.dumps(have.get(key))}")
    return f"{len(recorded)} layer(s) recorded, the embedded model has {len(actual)}"


def _serve(serving, feeds: dict) -> dict:
    """Call the loaded signature; inside a distribution strategy's scope (finetune --strategy
    loads the model there) the SavedModel's variables are distributed and the signature must run
    in a replica context: run it on each replica and take the first's outputs."""
    if not tf.distribute.has_strategy():
        return serving(**feeds)
    strategy = tf.distribute.get_strategy()
    outputs = strategy.run(serving, kwargs=feeds)
    return {name: strategy.experimental_local_results(value)[0]
            for name, value in outputs.items()}


def _check_serving(path: Path, manifest: dict, model, safe_mode: bool = True) -> None:
    """serving_default equals the embedded model with its swapped layers lowered."""
    batch_size = _check_batch(manifest, path)
    if safe_mode:  # before tf.saved_model.load runs anything of the file's
        check_program(path, own_export=True)
    _check_serving_form(path, manifest, model)
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:  # noqa: BLE001 - TensorFlow raises many types; one clear line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SavedModelConsistencyError(
            f"{path}: TensorFlow cannot load its serving half (saved_model.pb + variables/): "
            f"{type(exc).__name__}: {first}. It was damaged or edited; re-export the directory") \
            from None
    serving = loaded.signatures.get(SIGNATURE) if hasattr(loaded, "signatures") else None
    if serving is None:
        raise SavedModelConsistencyError(f"{path}: the SavedModel has no {SIGNATURE} signature; "
                                         f"it was edited. Re-export the directory")
    input_names, output_names = signature_names(model)
    specs = serving.structured_input_signature[1]
    if sorted(specs) != sorted(input_names) or sorted(serving.structured_outputs) != sorted(
            output_names):
        raise SavedModelConsistencyError(
            f"{path}: {SIGNATURE} takes {sorted(specs)} and returns "
            f"{sorted(serving.structured_outputs)}, the embedded model {input_names} -> "
            f"{output_names}: the serving graph and the embedded model are not one export")
    batch = sample_inputs(model, batch_size, seed=CHECK_SEED,
                          sequence_length=_check_length(manifest, path))
    batches = batch if isinstance(batch, list) else [batch]
    lowered, _ = lower_model(model, marked=True)
    reference = run_model(lowered, batch)
    try:
        result = _serve(serving, {name: tf.constant(value, dtype=specs[name].dtype)
                                  for name, value in zip(input_names, batches)})
        actual = [np.asarray(result[name]) for name in output_names]
        comparison = compare_outputs(reference, actual, f"the {SIGNATURE} signature")
    except SavedModelConsistencyError:
        raise
    except Exception as exc:  # noqa: BLE001 - a shape mismatch inside TensorFlow or ours
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SavedModelConsistencyError(
            f"{path}: the serving graph does not run on the embedded model's inputs "
            f"({type(exc).__name__}: {first}): the two halves are not one export") from None
    allowed = RELATIVE_TOLERANCE * comparison.scale
    if not comparison.max_difference <= allowed:
        raise SavedModelConsistencyError(
            f"{path}: the serving signature (saved_model.pb + variables/) and the embedded model "
            f"(assets/{EMBED_DIR}/{MODEL_FILE}, swapped layers lowered) disagree: max |difference| "
            f"{comparison.max_difference:.3g} on the manifest's sample batch of {batch_size} "
            f"(allowed {allowed:.3g}), so one half was replaced or edited (e.g. variables/ copied "
            f"from another export). Re-export the directory from the model you trust")


def _check_serving_form(path: Path, manifest: dict, model) -> None:
    """The serving half is the export of the embedded model, op by op and weight by weight
    (graphswap.io.savedmodel_serving); SavedModelConsistencyError otherwise."""
    try:
        stored = serving_form(path)
    except ModelLoadError as exc:
        raise SavedModelConsistencyError(
            f"{path}: its serving half (saved_model.pb + variables/) cannot be read as graphswap "
            f"writes it ({str(exc).replace(str(path), '').lstrip(': ')}); it was edited or "
            f"replaced. Re-export the directory from the model you trust") from None
    found = differences(stored, reference_form(model))
    if found is None:
        return
    what, kind = found
    if kind == "weights":
        raise SavedModelConsistencyError(
            f"{path}: the serving signature (saved_model.pb + variables/) and the embedded model "
            f"(assets/{EMBED_DIR}/{MODEL_FILE}, swapped layers lowered) disagree: {what}, so "
            f"variables/ was replaced or edited (e.g. copied from another export). Re-export the "
            f"directory from the model you trust")
    written = (str(manifest.get("graphswap_version")), stored.tensorflow)
    versions = "" if written == (__version__, tf.__version__) else (
        f" - or written by another version (graphswap {written[0]}, TensorFlow {written[1]}; "
        f"this is graphswap {__version__}, TensorFlow {tf.__version__}) whose export differs")
    raise SavedModelConsistencyError(
        f"{path}: the serving graph (saved_model.pb) is not what graphswap exports from the "
        f"embedded model (assets/{EMBED_DIR}/{MODEL_FILE}): its {SIGNATURE} signature {what}. "
        f"graphswap accepts a serving graph only if it is that export op for op and weight for "
        f"weight (a check of its outputs on a sample batch cannot show it answers the same on "
        f"every input), so it was replaced or edited{versions}. Re-export the directory from the "
        f"model you trust (graphswap export MODEL --format savedmodel)")
