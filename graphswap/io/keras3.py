"""Reading Keras 3 model files (.keras archives, full-model HDF5) with one clear error per failure.

A .keras archive's config.json and metadata.json are size-checked before Keras reads them
(`check_archive_members`): Keras reads them into memory whole.

Keras wraps many failures in its own exception types; `load_keras_file` translates them into one
ModelLoadError saying what was wrong and what would work, and lets graphswap's own errors (an
untrusted kernel: KernelTrustError) through unchanged.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import keras

from graphswap.errors import GraphswapError, ModelLoadError
from graphswap.io import tf_op_layer as _tf_op_layer  # noqa: F401 - registers TFOpLambda
from graphswap.swap import layers as _swapped_layers  # noqa: F401 - registers the swapped layers


#: largest config.json / metadata.json graphswap lets Keras read from a .keras archive.  Real
#: configs are kilobytes to a few megabytes; one that inflates to gigabytes is an attack (Keras
#: reads it into memory whole, and parses it).
MAX_ARCHIVE_JSON_BYTES = 64 * 1024 * 1024
ARCHIVE_JSON_MEMBERS = ("config.json", "metadata.json")


def check_archive_members(path: Path) -> None:
    """Refuse a .keras archive whose JSON members would inflate beyond MAX_ARCHIVE_JSON_BYTES,
    before Keras reads them: by the size the archive declares, and by decompressing at most that
    many bytes (a declared size can lie).  Raises ModelLoadError."""
    limit = MAX_ARCHIVE_JSON_BYTES
    try:
        with zipfile.ZipFile(path) as archive:
            for name in ARCHIVE_JSON_MEMBERS:
                try:
                    info = archive.getinfo(name)
                except KeyError:
                    continue
                declared = info.file_size
                if declared > limit:
                    raise ModelLoadError(_too_large(path, name, f"declares {declared:,} bytes,"))
                with archive.open(info) as member:
                    inflated = 0
                    while True:
                        block = member.read(1 << 20)
                        if not block:
                            break
                        inflated += len(block)
                        if inflated > limit:
                            raise ModelLoadError(_too_large(path, name, "inflates to"))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
        raise ModelLoadError(f"{path} is not a valid Keras archive: {exc}; re-save or re-copy "
                             f"the model") from None


def _too_large(path: Path, name: str, how: str) -> str:
    return (f"{path}: its {name} {how} more than the {MAX_ARCHIVE_JSON_BYTES:,} bytes graphswap "
            f"reads (a model's configuration is kilobytes to a few megabytes); refusing to load it "
            f"- a file that inflates to gigabytes would exhaust the memory. Re-save the model, or "
            f"check where the file came from")


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

