#!/usr/bin/env python
"""Throughput of graphswap's exact float32 kernels next to TensorFlow's, measured in one run.

    python benchmarks/bench_kernels_f32.py [--lib path/to/libgraphswap_kernels.so] [--reps N]

Without --lib the shipped library is built from native_kernels/ into a temporary directory (with
graphswap/compiler.py, loaded by path, so the package need not be installed).  For every shape it
prints GFLOP/s of graphswap_matmul_f32 / graphswap_conv2d_f32 and of tf.linalg.matmul /
tf.nn.conv2d (eager, inputs already tf.Tensors), the ratio ours/TF, and the maximum error of our
result against a float64 NumPy reference, relative to sum |a||b| (float32 round-off is ~1e-7..1e-6).
Times are medians over repetitions after warm-up, ours and TF's measured back to back in the same
process.  OMP_WAIT_POLICY=PASSIVE is set before the library loads, as graphswap does.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FLOAT_P = ctypes.POINTER(ctypes.c_float)
I64 = ctypes.c_int64


class ConvParams(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "batch in_height in_width in_channels filter_height filter_width out_channels out_height "
        "out_width stride_height stride_width dilation_height dilation_width pad_top pad_bottom "
        "pad_left pad_right groups").split()]


def build_library(out_dir: Path) -> Path:
    spec = importlib.util.spec_from_file_location("gs_compiler", REPO / "graphswap" / "compiler.py")
    compiler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compiler)
    return compiler.build_shipped_library(REPO / "native_kernels", out_dir / "libgraphswap_kernels.so")


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.graphswap_matmul_f32.argtypes = [FLOAT_P, FLOAT_P, FLOAT_P, I64, I64, I64]
    lib.graphswap_matmul_f32.restype = ctypes.c_int32
    lib.graphswap_conv2d_f32.argtypes = [FLOAT_P, FLOAT_P, FLOAT_P, ctypes.POINTER(ConvParams)]
    lib.graphswap_conv2d_f32.restype = ctypes.c_int32
    lib.graphswap_last_error.restype = ctypes.c_char_p
    return lib


def ptr(a: np.ndarray):
    return a.ctypes.data_as(FLOAT_P)


def median_times(fns, reps: int, budget: float) -> list[float]:
    """Median seconds per call of each fn, measured in blocks (all calls of one fn, then the next).

    Blocks rather than alternating calls: TensorFlow's Eigen pool keeps spinning for a while after
    each op, and an alternating loop would mostly measure how the two pools disturb each other.
    Each block starts with warm-up calls, which also let the other library's threads go idle.
    """
    out = []
    for f in fns:
        for _ in range(3):
            f()
        t = time.perf_counter()
        f()
        est = time.perf_counter() - t
        n = max(5, min(reps, int(budget / 2 / max(est, 1e-7))))
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            f()
            samples.append(time.perf_counter() - t)
        out.append(float(np.median(samples)))
    return out


def same_padding(size: int, filt: int, stride: int) -> tuple[int, int, int]:
    out = -(-size // stride)
    total = max((out - 1) * stride + filt - size, 0)
    return out, total // 2, total - total // 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", type=Path, help="kernel library to load (default: build it now)")
    ap.add_argument("--reps", type=int, default=50, help="max repetitions per shape (default 50)")
    ap.add_argument("--budget", type=float, default=1.5, help="seconds per shape (default 1.5)")
    args = ap.parse_args()

    tmp = None
    if args.lib is None:
        tmp = tempfile.TemporaryDirectory(prefix="gs_bench_")
        args.lib = build_library(Path(tmp.name))
    lib = load(args.lib)

    import tensorflow as tf  # after the library: its OpenMP runtime is set up with our env

    rng = np.random.default_rng(0)
    print(f"library: {args.lib}")
    print(f"tensorflow {tf.__version__}, numpy {np.__version__}, cores: {os.cpu_count()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    header = f"{'case':<44} {'ours GF/s':>10} {'TF GF/s':>10} {'ours/TF':>8} {'ours ms':>9} {'TF ms':>9} {'max rel err':>12}"
    print(header)
    print("-" * len(header))
    ratios = []

    def report(name, flops, t_ours, t_tf, err):
        r = t_tf / t_ours
        ratios.append((name, r))
        print(f"{name:<44} {flops / t_ours / 1e9:10.2f} {flops / t_tf / 1e9:10.2f} {r:8.2f} "
              f"{t_ours * 1e3:9.3f} {t_tf * 1e3:9.3f} {err:12.2e}", flush=True)

    # ---- matmul ----
    for m, k, n in [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
                    (256, 400, 120), (256, 120, 84), (256, 84, 10)]:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        pa, pb, pc = ptr(a), ptr(b), ptr(c)
        ta, tb = tf.constant(a), tf.constant(b)
        fn = lib.graphswap_matmul_f32

        def ours():
            rc = fn(pa, pb, pc, m, k, n)
            if rc:
                raise RuntimeError(lib.graphswap_last_error().decode())

        t_ours, t_tf = median_times([ours, lambda: tf.linalg.matmul(ta, tb)], args.reps, args.budget)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        err = float(np.max(np.abs(c - a64 @ b64) / (np.abs(a64) @ np.abs(b64))))
        report(f"matmul ({m},{k})x({k},{n})", 2.0 * m * k * n, t_ours, t_tf, err)

    # ---- conv2d ----
    for name, (nb, h, w, cin, fh, fw, cout, padding) in [
        ("conv LeNet C1 256x32x32x1 5x5x1x6 VALID", (256, 32, 32, 1, 5, 5, 6, "VALID")),
        ("conv LeNet C3 256x14x14x6 5x5x6x16 VALID", (256, 14, 14, 6, 5, 5, 16, "VALID")),
        ("conv 8x56x56x64 3x3x64x64 SAME", (8, 56, 56, 64, 3, 3, 64, "SAME")),
    ]:
        x = rng.standard_normal((nb, h, w, cin), dtype=np.float32)
        f = rng.standard_normal((fh, fw, cin, cout), dtype=np.float32)
        if padding == "SAME":
            oh, pt, pb_ = same_padding(h, fh, 1)
            ow, pl, pr = same_padding(w, fw, 1)
        else:
            oh, ow, pt, pb_, pl, pr = h - fh + 1, w - fw + 1, 0, 0, 0, 0
        params = ConvParams(nb, h, w, cin, fh, fw, cout, oh, ow, 1, 1, 1, 1, pt, pb_, pl, pr, 1)
        out = np.empty((nb, oh, ow, cout), np.float32)
        px, pf, po, pp = ptr(x), ptr(f), ptr(out), ctypes.byref(params)
        tx, tfilt = tf.constant(x), tf.constant(f)
        fn = lib.graphswap_conv2d_f32

        def ours():
            rc = fn(px, pf, po, pp)
            if rc:
                raise RuntimeError(lib.graphswap_last_error().decode())

        t_ours, t_tf = median_times([ours, lambda: tf.nn.conv2d(tx, tfilt, 1, padding)],
                                    args.reps, args.budget)
        ref = tf.nn.conv2d(tf.constant(x.astype(np.float64)), tf.constant(f.astype(np.float64)), 1,
                           padding).numpy()
        mag = tf.nn.conv2d(tf.constant(np.abs(x).astype(np.float64)),
                           tf.constant(np.abs(f).astype(np.float64)), 1, padding).numpy()
        err = float(np.max(np.abs(out - ref) / np.maximum(mag, 1e-30)))
        flops = 2.0 * nb * oh * ow * cout * fh * fw * cin
        report(name, flops, t_ours, t_tf, err)

    worst = min(ratios, key=lambda item: item[1])
    print(f"\nlowest ratio ours/TF: {worst[1]:.2f} ({worst[0]})")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
