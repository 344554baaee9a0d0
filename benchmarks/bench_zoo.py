#!/usr/bin/env python
"""The model zoo through graphswap, full size: convert report summaries and inference times.

    python benchmarks/bench_zoo.py [--models MobileNetV2,ResNet50,EfficientNetB0,ViT]
                                   [--multiplier mul8s_drum4] [--batch 8] [--size 224]

For each model (keras.applications with weights=None, nothing downloaded; the ViT is a ViT-Ti/16
style model built from MultiHeadAttention + Dense): the per-model `graphswap convert` report
summary line (share of the weight multiply-accumulates on the kernel), then inference time per
batch of the float model, the exact-kernel rewrite and the LUT-multiplier rewrite, measured side by
side in one process (median of repeated calls, best of rounds), with their ratios to float.
"""
from __future__ import annotations

import argparse
import os
import platform

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import machine_line, median_times, use_repository_package  # noqa: E402

use_repository_package()

import numpy as np  # noqa: E402


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def vit(image=224, patch=16, dim=192, heads=3, depth=12, classes=1000):
    import keras

    inputs = keras.Input((image, image, 3))
    x = keras.layers.Conv2D(dim, patch, strides=patch, name="patch_embed")(inputs)
    tokens = (image // patch) ** 2
    x = keras.layers.Reshape((tokens, dim))(x)
    for i in range(depth):
        h = keras.layers.LayerNormalization()(x)
        x = keras.layers.Add()([x, keras.layers.MultiHeadAttention(heads, dim // heads,
                                                                   name=f"mha{i}")(h, h)])
        h = keras.layers.LayerNormalization()(x)
        h = keras.layers.Dense(4 * dim, activation="gelu", name=f"mlp{i}a")(h)
        x = keras.layers.Add()([x, keras.layers.Dense(dim, name=f"mlp{i}b")(h)])
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.LayerNormalization()(x))
    return keras.Model(inputs, keras.layers.Dense(classes, name="head")(x), name="vit_ti16")


def build(name, size):
    import keras

    shape = (size, size, 3)
    if name == "MobileNetV2":
        return keras.applications.MobileNetV2(input_shape=shape, weights=None)
    if name == "ResNet50":
        return keras.applications.ResNet50(input_shape=shape, weights=None)
    if name == "EfficientNetB0":
        return keras.applications.EfficientNetB0(input_shape=shape, weights=None)
    if name == "ViT":
        return vit(image=size)
    raise SystemExit(f"unknown model {name!r}; choose from MobileNetV2, ResNet50, "
                     f"EfficientNetB0, ViT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--models", default="MobileNetV2,ResNet50,EfficientNetB0,ViT")
    parser.add_argument("--multiplier", default="mul8s_drum4")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import graphswap

    print(f"CPU: {cpu_model()}; {machine_line()}")
    print(f"input {args.size}x{args.size}x3, batch {args.batch}, multiplier {args.multiplier}")
    rows = []
    for name in args.models.split(","):
        model = build(name.strip(), args.size)
        exact, report = graphswap.rewrite_model(model, return_report=True)
        lut = graphswap.rewrite_model(model, kernel=args.multiplier)
        print(f"{name}: {len(report.swapped)} layers swapped; {report.summary_line()}")
        x = np.random.default_rng(0).uniform(0, 1, (args.batch, args.size, args.size, 3)).astype(
            np.float32)

        def runner(m):
            return lambda: m(x, training=False).numpy()

        times = median_times([runner(model), runner(exact), runner(lut)], reps=5, budget=20.0,
                             rounds=args.rounds)
        rows.append((name, *times))
    print()
    print(f"{'model':<16}{'float s/batch':>15}{'exact s/batch':>15}{'LUT s/batch':>13}"
          f"{'exact/float':>13}{'LUT/float':>11}")
    for name, t_float, t_exact, t_lut in rows:
        print(f"{name:<16}{t_float:>15.3f}{t_exact:>15.3f}{t_lut:>13.3f}"
              f"{t_exact / t_float:>13.2f}{t_lut / t_float:>11.2f}")


if __name__ == "__main__":
    main()
