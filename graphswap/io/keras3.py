"""Reading Keras 3 model files (.keras archives, full-model HDF5) with one clear error per failure.

Keras wraps many failures in its own exception types; `load_keras_file` translates them into one
ModelLoadError saying what was wrong and what would work, and lets graphswap's own errors (an
untrusted kernel: KernelTrustError) through unchanged.
"""

from __future__ import annotations

from pathlib import Path

import keras

from graphswap.errors import GraphswapError, ModelLoadError
from graphswap.swap import layers as _swapped_layers  # noqa: F401 - registers the swapped layers


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
        cause = graphswap_cause(exc)
        if cause is not None:
            raise cause from None
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ""
        if "Lambda" in str(exc) or "safe_mode" in str(exc):
            hint = (" The model contains a Lambda layer (Python code); load it only if you trust "
                    "the file, with safe_mode=False (CLI: --unsafe).")
        elif "Could not locate" in str(exc) or "Unknown layer" in str(exc):
            hint = (" The model uses custom classes; pass them with custom_objects= "
                    "(CLI: --custom-objects module.py).")
        raise ModelLoadError(f"cannot load model {path}: {type(exc).__name__}: {message}.{hint}") \
            from None
    return require_built(model, path)


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

