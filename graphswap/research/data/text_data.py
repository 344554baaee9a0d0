"""String data for models that take text: a tf.string input (keras.Input(shape=(1,),
dtype="string") -> TextVectorization / StringLookup / Hashing -> ...).

Accepted inputs: arrays of strings - NumPy unicode (`<U...`) or bytes (`S...`) arrays, and in
memory object arrays holding only str/bytes (an .npz holds `<U`/`S` arrays: graphswap never
unpickles a data file, so an object array there stays refused) - and `.txt` files, one example per
line (UTF-8; inputs only, so for the commands that read no labels: calibration, distillation).
Every accepted array becomes a NumPy unicode array of the model's input shape ((N,) is read as
(N, 1) for an input of shape (1,)); strings are never cast to float32 or scaled, and the
model's own layers (the TextVectorization) turn them into numbers, which is what the swapped
layers after them see.
"""

from __future__ import annotations

import os

import numpy as np

from graphswap.errors import DataError
from graphswap.research.data.data import Data, ModelExpectation
from graphswap.research.data.datafiles import describe_bytes, memory_available

TEXT_SUFFIX = ".txt"


def looks_like_strings(x) -> bool:
    """Whether `x` (an array) holds strings: a unicode/bytes array, or objects that are str."""
    x = np.asarray(x)
    if x.dtype.kind in "US":
        return True
    return x.dtype.kind == "O" and x.size > 0 and isinstance(x.flat[0], (str, bytes))


def _as_unicode(x: np.ndarray, label: str) -> np.ndarray:
    if x.dtype.kind == "U":
        return x
    if x.dtype.kind == "S":
        try:
            return np.char.decode(x, "utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{label}: a bytes input is not UTF-8 text ({exc}); pass str") \
                from None
    values = []
    for index, value in enumerate(x.reshape(-1)):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{label}: input {index} is bytes that are not UTF-8 text; "
                                f"pass str") from None
        if not isinstance(value, str):
            raise DataError(f"{label}: input {index} is a {type(value).__name__} ({value!r:.40}) "
                            f"among strings; the model's input takes strings, every example one")
        values.append(value)
    return np.array(values, dtype=str).reshape(x.shape) if values else x.astype(str)


def fit_strings(x, expect: ModelExpectation, label: str, notes: list) -> np.ndarray:
    """`x` checked as string inputs for `expect` and shaped like the model's input; DataError
    naming what is wrong."""
    x = np.asarray(x)
    if not looks_like_strings(x) and not (x.dtype.kind == "O" and x.size == 0):
        raise DataError(
            f"{label}: inputs have dtype {x.dtype}; the model's input takes strings (tf.string): "
            f"pass text, e.g. np.savez(path, x=np.array(texts), y=labels) (a unicode array), or "
            f"a .txt file with one example per line")
    x = _as_unicode(x, label)
    want, have = expect.input_shape, tuple(x.shape[1:])

    def matches(shape):
        return len(shape) == len(want) and all(w is None or w == h for w, h in zip(want, shape))

    if matches(have):
        return x
    if len(have) == len(want) - 1 and want[-1] == 1 and matches(have + (1,)):
        notes.append(f"{label}: added an axis ({x.shape} -> {(len(x),) + have + (1,)}), the "
                     f"model's input shape {expect.describe_input()}")
        return x[..., None]
    raise DataError(f"{label}: string inputs have shape {have} per example but the model takes "
                    f"({', '.join('None' if d is None else str(d) for d in want)}); for one "
                    f"text per example pass shape (N,) or (N, 1)")


def read_text_lines(path, label: str) -> np.ndarray:
    """The lines of a UTF-8 text file, one example each, as a unicode array (N,)."""
    size = os.path.getsize(path)
    available = memory_available()
    if available is not None and 8 * size > available:
        raise DataError(f"{path} holds {describe_bytes(size)} of text, which as an array takes up "
                        f"to {describe_bytes(8 * size)}; this machine has "
                        f"{describe_bytes(available)} available: use a smaller file")
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line} is not UTF-8 text ({exc.reason}); save the file as "
                        f"UTF-8, one example per line") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the last line
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    if not lines:
        raise DataError(f"{label} ({path}) is empty: 0 lines")
    longest = max(len(line) for line in lines)
    if available is not None and 4 * longest * len(lines) > available:
        raise DataError(f"{path}: {len(lines)} lines of up to {longest} characters take "
                        f"{describe_bytes(4 * longest * len(lines))} as an array; this machine "
                        f"has {describe_bytes(available)} available: split long lines or use a "
                        f"smaller file")
    return np.array(lines, dtype=str)


def from_string_arrays(x, y, origin: str, expect: ModelExpectation, scale, label: str, task,
                       labels: str = "required") -> Data:
    """Data of string inputs `x` and labels `y` (None: none) for a model that takes strings."""
    notes: list[str] = []
    x = np.asarray(x) if not isinstance(x, np.ndarray) else x
    if x.ndim == 0:
        raise DataError(f"{label} ({origin}): the inputs are a single string; expected one per "
                        f"example, an array of shape (N,)")
    if len(x) == 0:
        raise DataError(f"{label} ({origin}) is empty: 0 examples")
    if scale is not None:
        raise DataError(f"{label}: the model's input takes strings; a scale (--scale) applies to "
                        f"numbers only - leave it out")
    x = fit_strings(x, expect, label, notes)
    if labels == "unused":
        y = None
    elif y is None and labels != "optional":
        raise DataError(f"{label} ({origin}) holds inputs but no labels; the model's task "
                        f"({task.kind}) needs them: save texts and labels together "
                        f"(np.savez(path, x=np.array(texts), y=labels)), or fine-tune without "
                        f"labels by distillation (--teacher original)")
    label_format = "none"
    if y is not None:
        y, label_format = task.prepare_labels(y, len(x), label, notes)
    else:
        y = np.zeros(len(x), np.float32)
    notes.insert(0, f"{label}: {len(x)} texts from {origin}, inputs {expect.describe_input()} "
                    f"strings, labels {'none (not used)' if label_format == 'none' else label_format}")
    notes.append(f"{label}: strings passed unchanged to the model (its own layers turn them "
                 f"into numbers)")
    return Data(origin, expect, x=x, y=y, count=len(x), label_format=label_format, scale=None,
                notes=notes, task=task)
