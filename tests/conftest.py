"""Shared fixtures: the sample model and data, small models of every topology, user C libraries."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SAMPLE_MODEL = REPO / "sample_models" / "lenet5.keras"
SAMPLE_DATA = REPO / "sample_models" / "digits.npz"
HEADER_DIR = REPO / "native_kernels" / "include"


@pytest.fixture(scope="session")
def digits():
    with np.load(SAMPLE_DATA) as data:
        return {key: data[key] for key in data.files}


@pytest.fixture()
def lenet():
    return keras.models.load_model(SAMPLE_MODEL)


def load_sample_script():
    """sample_models/make_lenet5.py as a module (the architecture and data preparation)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_lenet5",
                                                  REPO / "sample_models" / "make_lenet5.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_nested_functional(seed: int = 0) -> keras.Model:
    """Two inputs, two outputs, a nested Sequential inside a nested Functional, a shared Dense."""
    keras.utils.set_random_seed(seed)
    inner_seq = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="inner_conv"),
        keras.layers.Conv2D(6, 3, strides=2, name="inner_conv_s2"),
    ], name="inner_seq")
    inner_in = keras.Input((8, 8, 3))
    inner_out = keras.layers.Flatten()(inner_seq(inner_in))
    inner_func = keras.Model(inner_in, keras.layers.Dense(5, activation="tanh", name="inner_dense")(
        inner_out), name="inner_func")
    image = keras.Input((8, 8, 3), name="image")
    vector = keras.Input((7,), name="vector")
    shared = keras.layers.Dense(5, name="shared_dense")
    a = shared(inner_func(image))
    b = shared(keras.layers.Dense(5, name="vec_dense")(vector))
    merged = keras.layers.Concatenate()([a, b])
    out1 = keras.layers.Dense(3, activation="softmax", name="head_a")(merged)
    out2 = keras.layers.Dense(1, name="head_b")(keras.layers.Add()([a, b]))
    return keras.Model([image, vector], [out1, out2], name="outer")


@pytest.fixture()
def nested_model():
    return build_nested_functional()


def compile_library(tmp_path: Path, name: str, source: str) -> Path:
    """Compile a small C library against graphswap_kernels.h into tmp_path."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / f"{name}.c"
    src.write_text(textwrap.dedent(source))
    out = tmp_path / f"lib{name}.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{HEADER_DIR}", str(src), "-o", str(out)],
                   check=True, capture_output=True)
    return out


def run_python(code: str, timeout: int = 600, env=None) -> subprocess.CompletedProcess:
    """Run Python code in a fresh interpreter (for device setup that must precede TF init)."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    import graphswap

    package_root = str(Path(graphswap.__file__).resolve().parent.parent)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=str(REPO))
