"""Reading Keras 3 model files (.keras archives, full-model HDF5) with one clear error per failure.

Every member of a .keras archive is size-checked before Keras reads it (`check_archive_members`):
Keras reads config.json and the weights into memory whole, so a member that inflates to gigabytes
from a small file is refused first.

Keras wraps many failures in its own exception types; `load_keras_file` translates them into one
ModelLoadError saying what was wrong and what would work, and lets graphswap's own errors (an
untrusted kernel: KernelTrustError) through unchanged.
"""

from __future__ import annotations

import lzma
import os
import re
import zipfile
import zlib
from pathlib import Path

import keras

from graphswap.errors import GraphswapError, ModelLoadError
from graphswap.input_files import MAX_MODEL_JSON_DEPTH, check_json_depth
from graphswap.io import tf_op_layer as _tf_op_layer  # noqa: F401 - registers TFOpLambda
from graphswap.swap import layers as _swapped_layers  # noqa: F401 - registers the swapped layers


#: largest config.json / metadata.json graphswap lets Keras read from a .keras archive.  Real
#: configs are kilobytes to a few megabytes; one that inflates to gigabytes is an attack (Keras
#: reads it into memory whole, and parses it).
MAX_ARCHIVE_JSON_BYTES = 64 * 1024 * 1024
ARCHIVE_JSON_MEMBERS = ("config.json", "metadata.json")
#: Every member of a .keras archive (the weights model.weights.h5 above all, which Keras reads
#: into memory whole) is bounded before Keras opens the archive.  Keras writes its members
#: uncompressed (stored: as many bytes inflated as on disk), and weights recompressed by a zip
#: tool shrink a few times at most (floats are nearly incompressible); deflate itself reaches
#: about 1000:1 only on runs of one byte, which is what a "zip bomb" holds (a 1 MB file of 1 GB
#: of zeros).  So a member may inflate to at most MAX_EXPANSION times its compressed size - once
#: it is larger than EXPANSION_FLOOR, so that small, very compressible members (a config, a
#: zero-initialised layer) always pass - and the whole archive to at most MAX_EXPANSION times
#: the archive's size (plus the floor: many small members add up) and to MAX_ARCHIVE_BYTES, a
#: model of several GB of weights with room to spare (graphswap runs 8-bit arithmetic on models
#: that fit one machine).  A stored archive of real weights passes at any size up to that.
MAX_EXPANSION = 100
EXPANSION_FLOOR = 64 * 1024 * 1024
MAX_ARCHIVE_BYTES = 16 * 1024 * 1024 * 1024


def check_archive_members(path: Path) -> None:
    """Refuse a .keras archive whose members would inflate beyond the bounds above (and JSON
    members beyond MAX_ARCHIVE_JSON_BYTES, or nested deeper than MAX_MODEL_JSON_DEPTH), before
    Keras reads it: by the sizes the archive declares, then by reading every member through, in
    blocks, to at most its declared size + 1 byte.  The declared sizes bound what Keras can read
    (Python's zipfile, Keras' too, never yields more than a member declares); the read-through
    refuses a member whose data is not what it declares (CRC, truncation) here, in one message,
    and keeps nothing but the JSON members (at most MAX_ARCHIVE_JSON_BYTES each).  Raises
    ModelLoadError."""
    try:
        archive_bytes = os.path.getsize(path)
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            _check_declared(path, members, archive_bytes)
            for info in members:
                json_member = info.filename in ARCHIVE_JSON_MEMBERS
                text = _read_through(path, archive, info, keep=json_member)
                if json_member:
                    check_json_depth(text, f"{path}: its {info.filename}", ModelLoadError,
                                     MAX_MODEL_JSON_DEPTH)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, zlib.error,
            lzma.LZMAError, NotImplementedError, RuntimeError) as exc:  # damaged, encrypted
        raise ModelLoadError(f"{path} is not a valid Keras archive: {exc}; re-save or re-copy "
                             f"the model") from None


def _check_declared(path: Path, members, archive_bytes: int) -> None:
    total = 0
    for info in members:
        declared = info.file_size
        total += declared
        if info.filename in ARCHIVE_JSON_MEMBERS and declared > MAX_ARCHIVE_JSON_BYTES:
            raise ModelLoadError(_too_large(path, info.filename, f"declares {declared:,} bytes,"))
        if declared > EXPANSION_FLOOR and declared > MAX_EXPANSION * info.compress_size:
            ratio = declared / max(info.compress_size, 1)
            raise ModelLoadError(_inflates(
                path, f"its member {info.filename} declares {declared:,} bytes inflated from "
                      f"{info.compress_size:,} compressed ({ratio:,.0f}:1)"))
    if total > MAX_ARCHIVE_BYTES or (total > EXPANSION_FLOOR
                                     and total > MAX_EXPANSION * archive_bytes):
        raise ModelLoadError(_inflates(
            path, f"its {len(members):,} members declare {total:,} bytes in all, from a file of "
                  f"{archive_bytes:,} bytes"))


def _read_through(path: Path, archive, info, keep: bool) -> bytes:
    """Read the member `info` to its end, at most its declared size + 1 byte (ModelLoadError
    beyond); its bytes when `keep` (a JSON member, at most MAX_ARCHIVE_JSON_BYTES)."""
    limit = info.file_size
    kept, inflated = [], 0
    with archive.open(info) as member:
        while True:
            block = member.read(min(1 << 20, limit + 1 - inflated))
            if not block:
                break
            inflated += len(block)
            if inflated > limit:  # zipfile stops at the declared size; should it not
                raise ModelLoadError(_inflates(path, f"its member {info.filename} inflates to "
                                                     f"more than the {limit:,} bytes it declares"))
            if keep:
                kept.append(block)
    return b"".join(kept)


def _too_large(path: Path, name: str, how: str) -> str:
    return (f"{path}: its {name} {how} more than the {MAX_ARCHIVE_JSON_BYTES:,} bytes graphswap "
            f"reads (a model's configuration is kilobytes to a few megabytes); refusing to load it "
            f"- a file that inflates to gigabytes would exhaust the memory. Re-save the model, or "
            f"check where the file came from")


def _inflates(path: Path, what: str) -> str:
    return (f"{path}: {what}; graphswap reads a .keras archive whose members inflate to at most "
            f"{MAX_EXPANSION}x their compressed size (beyond {EXPANSION_FLOOR // (1 << 20)} MiB) "
            f"and {MAX_ARCHIVE_BYTES // (1 << 30)} GiB in all (Keras writes them uncompressed, "
            f"and reads the weights into memory whole); refusing to load it - a file that "
            f"inflates to gigabytes would exhaust the memory. Re-save the model with "
            f"model.save('model.keras'), or check where the file came from")


def require_built(model, path: Path):
    """Refuse a Sequential model saved before it was built: it has no input shape, no weights."""
    if not isinstance(model, keras.Sequential):
        return model  # Functional models always have inputs; subclassed ones are refused later
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs:
        raise ModelLoadError(
            f"{path} holds an unbuilt model ({model.name!r}: no input shape and no weights); it "
            f"was saved before it was built. Give it an input shape (keras.Input(shape) as the "
            f"first layer, model.build(input_shape), or call it on data), train it, and save it "
            f"again")
    return model


def load_keras_file(path: Path, custom_objects=None, safe_mode: bool = True, compile: bool = True):  # noqa: A002
    """Load a .keras / full-model .h5 file, raising ModelLoadError (or graphswap's own error)."""
    try:
        model = keras.models.load_model(path, custom_objects=custom_objects, safe_mode=safe_mode,
                                        compile=compile)
    except (ModelLoadError,) as exc:
        raise exc
    except Exception as exc:  # noqa: BLE001 - translate Keras' many failure types into one message
        raise describe_load_failure(path, exc) from None
    return require_built(model, path)


def describe_load_failure(path, exc: BaseException) -> GraphswapError:
    """The one error for a model Keras could not load: graphswap's own error behind it if there
    is one (an untrusted kernel, an untranslatable Keras 2 option), else a ModelLoadError naming
    what failed, with --unsafe / --custom-objects advice where they would help."""
    cause = graphswap_cause(exc)
    if cause is not None:
        return cause
    refused = _refused_weights(path, str(exc))
    if refused is not None:
        return refused
    text = str(exc).strip()
    message = text.splitlines()[0] if text else type(exc).__name__
    if len(message) > 300:  # Keras quotes whole layer configs; the class and the reason suffice
        message = message[:240] + " ... " + message[-60:]
    hint = ""
    if "Lambda" in text or "safe_mode" in text:
        hint = (" The model contains a Lambda layer (Python code); load it only if you trust "
                "the file, with safe_mode=False (CLI: --unsafe).")
    elif "Could not locate" in text or "Unknown layer" in text:
        hint = (" The model uses custom classes; pass them with custom_objects= "
                "(CLI: --custom-objects module.py).")
    return ModelLoadError(f"cannot load model {path}: {type(exc).__name__}: {message}.{hint}")


#: Keras' one error for the weights of several objects it could not load (saving_lib): its first
#: line names no reason; the example error after it does
_AGGREGATE = re.compile(r"A total of (\d+) objects could not be loaded\. Example error message "
                        r"for object (.*?):\n\n(.*?)\n\nList of objects that could not be "
                        r"loaded:\n(.*)", re.S)


def _refused_weights(path, text: str):
    """ModelLoadError naming the object whose weights Keras refused and why, for Keras'
    aggregate message; None for any other."""
    match = _AGGREGATE.match(text.strip())
    if match is None:
        return None
    count, example, reason, listed = match.groups()
    reason = " ".join(reason.split("Target variable:")[0].split()) or "no reason given"
    if len(reason) > 300:
        reason = reason[:240] + " ... " + reason[-40:]
    names = re.findall(r"<(\w+) name=([^,>]+)", listed)
    shown = ", ".join(f"{kind} {name!r}" for kind, name in names[:5]) or example
    return ModelLoadError(
        f"cannot load model {path}: the weights of {count} object(s) ({shown}"
        f"{', ...' if len(names) > 5 else ''}) were refused: {reason}. The weights stored in "
        f"the file do not fit its architecture (the file was edited or damaged, or holds "
        f"links to other files); re-save the model from the code or checkpoint that made it")


def graphswap_cause(exc: BaseException):
    """The GraphswapError behind an exception Keras wrapped (deserialisation re-raises as
    TypeError), so an untrusted kernel surfaces as KernelTrustError, not a generic load failure."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, GraphswapError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None

