"""FP8 on the device path under Keras's JAX backend: graphswap/kernels/device_fp8.py is keras.ops
only, so a fresh process with KERAS_BACKEND=jax and TensorFlow made unimportable computes the FP8
codes and products under jax.jit: codes bit for bit the C path's (every float32 class), integer-
valued tables' sums bit for bit, the exact built-ins within float32 summation round-off."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from conftest import assert_close_to_roundoff
from test_fp8 import _float32_cases

import graphswap
from graphswap.kernels import QuantScheme
from graphswap.kernels.fp8 import E4M3, E5M2, Fp8Kernel, Fp8Spec, encode
from graphswap.native import conv_geometry

WORKER = textwrap.dedent("""
    import json, sys, types
    import numpy as np
    sys.modules["tensorflow"] = None          # nothing of TensorFlow may be needed
    import jax
    import keras
    assert keras.backend.backend() == "jax", keras.backend.backend()
    from graphswap.native import ConvGeometry

    from graphswap.kernels import device_fp8 as fp8
    data = np.load(sys.argv[1])
    spec = json.loads(str(data["spec"]))
    results = {}
    for name, fmt in spec["formats"].items():
        fmt = types.SimpleNamespace(**fmt)
        results[f"codes_{name}"] = np.asarray(jax.jit(lambda t: fp8.fp8_encode(t, fmt))(
            data[f"values_{name}"]))
    for i, case in enumerate(spec["cases"]):
        fmt = types.SimpleNamespace(**spec["formats"][case["format"]])
        scheme = types.SimpleNamespace(**case["scheme"])
        table = data[f"table{i}"] if case["table"] else None
        if case["op"] == "matmul":
            fn = jax.jit(lambda a, b: fp8.fp8_matmul(a, b, fmt, table, scheme, budget=40))
        else:
            geometry = ConvGeometry(**case["geometry"])
            fn = jax.jit(lambda a, b: fp8.fp8_conv2d(a, b, fmt, table, scheme, geometry))
        results[f"out{i}"] = np.asarray(fn(data[f"a{i}"], data[f"b{i}"]))
    np.savez(sys.argv[2], **results)
    print("ran", len(spec["cases"]), "cases on", jax.devices()[0].platform)
""")


def _format(fmt):
    return {"bias": fmt.bias, "mantissa_bits": fmt.mantissa_bits,
            "max_finite": fmt.max_finite, "nan_code": fmt.nan_code}


def _operands(rng, shape, specials=False):
    t = (rng.normal(size=shape) * 1.7).astype(np.float32)
    if specials:
        t.reshape(-1)[1], t.reshape(-1)[-2] = np.nan, -np.inf
    return t


def test_fp8_device_path_under_jax(tmp_path):
    rng = np.random.default_rng(0)
    integer = rng.integers(-50, 51, (256, 256)).astype(np.float32)
    cases = [  # format, table, op, shapes, conv options, scheme, specials
        ("e4m3", None, "matmul", ((9, 13), (13, 3)), None, QuantScheme(), True),
        ("e5m2", integer, "matmul", ((6, 70), (70, 4)), None,
         QuantScheme(granularity="per_tensor").with_range(-1.0, 2.0), True),
        ("e4m3", integer, "conv", ((2, 9, 8, 6), (3, 3, 3, 4)), ((2, 1), (1, 1), "same", 2),
         QuantScheme(), True),
        ("e5m2", None, "conv", ((1, 7, 7, 3), (2, 2, 3, 5)), ((1, 1), (2, 1), "valid", 1),
         QuantScheme().with_range(-0.5, 3.0), False),
    ]
    formats = {"e4m3": E4M3, "e5m2": E5M2}
    arrays, spec, expected = {}, [], []
    for name, fmt in formats.items():
        values = _float32_cases(fmt)[::7]       # every class, a seventh of the 1.3 million
        arrays[f"values_{name}"] = values
    for i, (name, table, op, shapes, conv, scheme, specials) in enumerate(cases):
        fmt = formats[name]
        kernel = Fp8Kernel(Fp8Spec(fmt)) if table is None else \
            Fp8Kernel(Fp8Spec(fmt, "npy", "/nowhere/t.npy"), table, "0" * 64)
        resolved = kernel.resolve_scheme(scheme)
        a, b = _operands(rng, shapes[0], specials), _operands(rng, shapes[1])
        geometry = conv_geometry(a.shape, b.shape, *conv) if conv else None
        expected.append(kernel.matmul(a, b, quant=resolved) if op == "matmul"
                        else kernel.conv2d(a, b, geometry, quant=resolved))
        arrays.update({f"a{i}": a, f"b{i}": b})
        if table is not None:
            arrays[f"table{i}"] = table
        spec.append({"format": name, "table": table is not None, "op": op,
                     "geometry": dataclasses.asdict(geometry) if geometry else None,
                     "scheme": {"activations": resolved.activations,
                                "activation_range": resolved.activation_range,
                                "granularity": resolved.granularity}})
    np.savez(tmp_path / "cases.npz", spec=json.dumps({"formats": {n: _format(f) for n, f in
                                                                 formats.items()},
                                                      "cases": spec}), **arrays)
    package = Path(graphswap.__file__).resolve().parent
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "JAX_ENABLE_X64": "1",
           "PYTHONPATH": str(package.parent)}
    run = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path / "cases.npz"),
                          str(tmp_path / "out.npz")],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert f"ran {len(cases)} cases on cpu" in run.stdout
    with np.load(tmp_path / "out.npz") as got:
        for name, fmt in formats.items():
            np.testing.assert_array_equal(got[f"codes_{name}"],
                                          encode(arrays[f"values_{name}"], fmt))
        for i, want in enumerate(expected):
            result = got[f"out{i}"]
            assert np.array_equal(np.isnan(result), np.isnan(want)), spec[i]
            if spec[i]["table"]:       # integer sums: exact
                np.testing.assert_array_equal(result, want, err_msg=str(spec[i]))
            else:
                keep = ~np.isnan(want)
                assert_close_to_roundoff(result[keep], want[keep], terms=27)
    assert any(np.isnan(w).any() for w in expected)
