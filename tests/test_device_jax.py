"""The device path under Keras's JAX backend: graphswap/kernels/device_products.py is written in
keras.ops only and imports nothing of TensorFlow (nor does `import graphswap` where TensorFlow is
not installed), so the same code runs where JAX (and CUDA) are installed but TensorFlow is not.
A fresh process with KERAS_BACKEND=jax and TensorFlow made unimportable computes the table-driven
matmul and convolution under jax.jit; its outputs equal the C kernels' bit for bit (every weight
encoding, both signednesses, static and dynamic ranges, grouped strided convolutions, 8xN weights,
non-finite values, tiny blocks).  Without 64-bit types (JAX's default) the float64 quantization
arithmetic cannot be exact: that is one clear error, not wrong numbers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import graphswap
from graphswap.kernels import LutKernel, QuantScheme, resolve_kernel
from graphswap.multipliers import builtin
from graphswap.native import conv_geometry

WORKER = textwrap.dedent("""
    import json, sys, types
    import numpy as np
    sys.modules["tensorflow"] = None          # nothing of TensorFlow may be needed
    import jax
    import keras
    assert keras.backend.backend() == "jax", keras.backend.backend()
    from graphswap.native import ConvGeometry
    from graphswap.kernels import device_products as dp
    cases, out = sys.argv[1], sys.argv[2]
    data = np.load(cases)
    spec = json.loads(str(data["spec"]))
    results = {}
    for i, case in enumerate(spec):
        scheme = types.SimpleNamespace(**case["scheme"])
        table = data[f"table{i}"]
        options = dict(budget=case["budget"], weight_bits=case["bits"])
        if case["op"] == "matmul":
            fn = jax.jit(lambda a, b: dp.lut_matmul(a, b, table, case["signed"], scheme,
                                                    **options))
        else:
            geometry = ConvGeometry(**case["geometry"])
            fn = jax.jit(lambda a, b: dp.lut_conv2d(a, b, table, case["signed"], scheme,
                                                    geometry, **options))
        results[f"out{i}"] = np.asarray(fn(data[f"a{i}"], data[f"b{i}"]))
    np.savez(out, **results)
    print("ran", len(spec), "cases on", jax.devices()[0].platform)
""")


def _random_table_kernel(signed: bool) -> LutKernel:
    base = builtin("mul8s_exact" if signed else "mul8u_exact")
    table = np.random.default_rng(3).integers(-40000, 60000, 65536).astype(np.int32)
    return LutKernel(dataclasses.replace(base, table=table, spec="random", name="random"))


def _operands(rng, shape, specials=False):
    t = (rng.normal(size=shape) * 1.7).astype(np.float32)
    if specials:
        t.reshape(-1)[1], t.reshape(-1)[-2] = np.nan, np.inf
    return t


def _cases():
    """(kernel, scheme, op, shapes, conv options, budget, weight bits, specials)."""
    drum4, trunc3s = resolve_kernel("mul8u_drum4"), resolve_kernel("mul8s_trunc3")
    yield drum4, QuantScheme(), "matmul", ((9, 13), (13, 3)), None, 1 << 22, 8, True
    yield drum4, QuantScheme(weights="asymmetric", granularity="per_tensor"), "matmul", \
        ((5, 70), (70, 4)), None, 7, 8, False
    yield _random_table_kernel(False), QuantScheme(weights="asymmetric").with_range(0.25, 2.0), \
        "matmul", ((6, 11), (11, 5)), None, 1 << 22, 8, True
    yield _random_table_kernel(True), QuantScheme().with_range(-0.7, 1.3), "matmul", \
        ((4, 9), (9, 2)), None, 5, 8, False
    yield trunc3s, QuantScheme(granularity="per_tensor"), "conv", ((2, 9, 8, 6), (3, 3, 3, 4)), \
        ((2, 1), (1, 1), "same", 2), 1 << 22, 8, True
    yield drum4, QuantScheme(weights="asymmetric").with_range(-1.0, 2.0), "conv", \
        ((1, 7, 7, 3), (2, 2, 3, 5)), ((1, 2), (2, 1), "valid", 1), 40, 8, False
    yield drum4, QuantScheme(), "matmul", ((7, 10), (10, 3)), None, 1 << 22, 4, False


def _expected(kernel, scheme, op, a, b, conv, bits):
    if bits != 8:
        kernel = LutKernel(dataclasses.replace(kernel.multiplier, weight_bits=bits))
    if op == "matmul":
        return kernel.matmul(a, b, quant=scheme), None
    geometry = conv_geometry(a.shape, b.shape, *conv)
    return kernel.conv2d(a, b, geometry, quant=scheme), geometry


def _run_worker(cases_path, out_path, env_extra):
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", **env_extra,
           "PYTHONPATH": str(Path(graphswap.__file__).resolve().parent.parent)}
    return subprocess.run([sys.executable, "-c", WORKER, str(cases_path), str(out_path)],
                          env=env, capture_output=True, text=True, timeout=900)


def test_the_device_path_under_jax_is_the_c_kernels_bit_for_bit(tmp_path):
    rng = np.random.default_rng(0)
    arrays, spec, expected = {}, [], []
    for i, (kernel, scheme, op, shapes, conv, budget, bits, specials) in enumerate(_cases()):
        if bits != 8:
            kernel = LutKernel(dataclasses.replace(kernel.multiplier, weight_bits=bits))
        resolved = kernel.resolve_scheme(scheme)
        a, b = _operands(rng, shapes[0], specials), _operands(rng, shapes[1])
        want, geometry = _expected(kernel, resolved, op, a, b, conv, 8)
        expected.append(want)
        arrays.update({f"a{i}": a, f"b{i}": b, f"table{i}": np.asarray(kernel.multiplier.table)})
        spec.append({"op": op, "signed": kernel.signed, "budget": budget, "bits": bits,
                     "geometry": dataclasses.asdict(geometry) if geometry else None,
                     "scheme": {"activations": resolved.activations,
                                "activation_range": resolved.activation_range,
                                "granularity": resolved.granularity,
                                "weights": resolved.weights}})
    np.savez(tmp_path / "cases.npz", spec=json.dumps(spec), **arrays)
    run = _run_worker(tmp_path / "cases.npz", tmp_path / "out.npz", {"JAX_ENABLE_X64": "1"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert f"ran {len(spec)} cases on cpu" in run.stdout
    with np.load(tmp_path / "out.npz") as got:
        for i, want in enumerate(expected):
            np.testing.assert_array_equal(got[f"out{i}"], want, err_msg=f"case {i}: {spec[i]}")
    assert any(np.isnan(w).any() for w in expected) and all(np.isfinite(w).any()
                                                            for w in expected)


def test_without_64_bit_types_jax_gets_one_clear_error(tmp_path):
    kernel = resolve_kernel("mul8u_drum4")
    resolved = kernel.resolve_scheme(QuantScheme())
    a, b = _operands(np.random.default_rng(1), (3, 4)), _operands(np.random.default_rng(2), (4, 2))
    spec = [{"op": "matmul", "signed": False, "budget": 1 << 22, "bits": 8, "geometry": None,
             "scheme": {"activations": resolved.activations, "activation_range": None,
                        "granularity": resolved.granularity, "weights": resolved.weights}}]
    np.savez(tmp_path / "cases.npz", spec=json.dumps(spec), a0=a, b0=b,
             table0=np.asarray(kernel.multiplier.table))
    run = _run_worker(tmp_path / "cases.npz", tmp_path / "out.npz", {"JAX_ENABLE_X64": "0"})
    assert run.returncode != 0 and not (tmp_path / "out.npz").exists()
    raised = [line for line in run.stderr.splitlines()
              if line.startswith("graphswap.errors.")]
    assert len(raised) == 1, run.stderr[-3000:]
    assert raised[0].startswith("graphswap.errors.QuantizationError: the device path's "
                                "quantization arithmetic is float64"), raised
    assert "JAX_ENABLE_X64=1" in raised[0]
