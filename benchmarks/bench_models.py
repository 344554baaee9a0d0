#!/usr/bin/env python
"""Larger models through graphswap, against the float model in the same run, the way users run
them (inside a tf.function, as fit/predict do):

    ResNet-8 (32x32x3)  MobileNetV2 (224x224)  ResNet-50 (224x224)   keras.applications /
    benchmarks/_models.py, random weights (weights=None: nothing downloaded); also Xception
    (SeparableConv2D) and a ViT-Ti/16 (MultiHeadAttention) on request; and the small edge models:
    MobileNetV1 (alpha 0.25, 96x96x3, 2 classes: MLPerf Tiny visual wake words), DSCNN (MLPerf
    Tiny keyword spotting, 49x10x1), Decoder (Dense -> 6x6x64 -> four stride-2 Conv2DTranspose to
    96x96x3, MSE) and LSTM (Embedding(2000, 64) over 100 tokens -> LSTM(64) -> Dense); and two
    larger ones: CodecDecoder (16x16x16 latents -> stride-2 Conv2DTranspose 3x3/16, 5x5/32,
    7x7/128 with ReLU to 128x128 -> Conv2D 3x3/3 sigmoid, MSE) and Dense1024 (three Dense(1024)
    with ReLU over 1024 features -> Dense(10))

For each model: inference per batch (tf.function forward) and one training step (tf.function:
forward, GradientTape, SGD apply) of the float model, the exact-kernel rewrite, the
LUT-multiplier rewrite (per-call ranges), the same multiplier calibrated (static ranges on 16
random inputs, --calibrate DATA's mode) and with TFApprox's asymmetric weights, with their ratios
to float (`--variants` picks fewer; float always runs).  Times are medians of repeated calls,
the variants alternating in blocks, best of `--rounds` (benchmarks/_timing.py).

    python benchmarks/bench_models.py [--models ResNet8,MobileNetV2,ResNet50,Xception,ViT,
        MobileNetV1,DSCNN,Decoder,LSTM,CodecDecoder,Dense1024] [--multiplier mul8u_drum4] [--batch 32] [--big-batch 8]
        [--decoder-batch 16] [--variants exact,lut,static,asym] [--rounds 2] [--no-train] [--as-avx2]

--batch is the batch of ResNet8, of the edge models and of Dense1024; --decoder-batch that of
Decoder and CodecDecoder; --big-batch that of the 224x224 models.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import machine_line, median_times, run_context, table_path_line, use_repository_package  # noqa: E402

use_repository_package()

import numpy as np  # noqa: E402

from _models import CODEC_AND_DENSE, EDGE_MODELS, build, train_step_fn  # noqa: E402  (benchmarks/ is on sys.path)


def inference_fn(model):
    import tensorflow as tf

    forward = tf.function(lambda x: model(x, training=False))
    return forward


VARIANTS = ("exact", "lut", "static", "asym")
AS_AVX2 = {"GRAPHSWAP_ISA": "avx2", "OPENBLAS_CORETYPE": "Haswell", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def inputs_for(model, batch, rng):
    """A batch of inputs, its labels (class indices, or a target image for an image output) and
    16 calibration inputs, for `model`'s input: token ids for an integer input, U(0, 1) else."""
    shape = tuple(model.inputs[0].shape[1:])
    if "int" in str(model.inputs[0].dtype):
        vocabulary = next(layer.input_dim for layer in model.layers
                          if hasattr(layer, "input_dim"))
        x = rng.integers(0, vocabulary, (batch, *shape)).astype(np.int32)
        calibration = rng.integers(0, vocabulary, (16, *shape)).astype(np.int32)
    else:
        x = rng.uniform(0, 1, (batch, *shape)).astype(np.float32)
        calibration = rng.uniform(0, 1, (16, *shape)).astype(np.float32)
    output = tuple(model.outputs[0].shape[1:])
    if len(output) > 1:  # an image: regress it
        return x, rng.uniform(0, 1, (batch, *output)).astype(np.float32), calibration, "mse"
    y = rng.integers(0, int(output[-1]), batch)
    return x, y, calibration, "sparse_categorical_crossentropy"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--models", default="ResNet8,MobileNetV2,ResNet50")
    parser.add_argument("--multiplier", default="mul8u_drum4")
    parser.add_argument("--batch", type=int, default=32, help="batch for ResNet-8, the edge models and Dense1024")
    parser.add_argument("--big-batch", type=int, default=8, help="batch for the 224x224 models")
    parser.add_argument("--decoder-batch", type=int, default=16, help="batch for Decoder, CodecDecoder")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="rewrites timed against float: any of exact, lut (the multiplier, "
                             "per-call ranges), static (calibrated), asym (asymmetric weights)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("--as-avx2", action="store_true",
                        help="an AVX2-only machine as far as this one can play it: graphswap's "
                             "avx2 path, OpenBLAS's Haswell kernels, oneDNN capped at AVX2 (the "
                             "float model too); the CPU line still names this CPU")
    args = parser.parse_args()
    if args.as_avx2:   # before TensorFlow, OpenBLAS and graphswap's library load
        os.environ.update(AS_AVX2)
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(VARIANTS)}")

    import graphswap

    print(run_context())
    print(machine_line())
    if args.as_avx2:
        print("--as-avx2: " + ", ".join(f"{k}={v}" for k, v in AS_AVX2.items()))
    print(table_path_line(args.multiplier))
    rows = []
    for name in args.models.split(","):
        name = name.strip()
        model = build(name, args.size)
        batch = (args.decoder_batch if name in ("Decoder", "CodecDecoder")
                 else args.batch if name == "ResNet8" or name in EDGE_MODELS + CODEC_AND_DENSE
                 else args.big_batch)
        rng = np.random.default_rng(0)
        x, y, calibration, loss = inputs_for(model, batch, rng)
        builders = {
            "exact": lambda: graphswap.rewrite_model(model, kernel="exact"),
            "lut": lambda: graphswap.rewrite_model(model, kernel=args.multiplier),
            # static, calibrated ranges: no min/max pass over each call's activations
            "static": lambda: graphswap.rewrite_model(model, kernel=args.multiplier,
                                                      calibration_data=calibration),
            # TFApprox's asymmetric weights: one table column per output channel where the
            # default sign-magnitude encoding needs two
            "asym": lambda: graphswap.rewrite_model(model, kernel=args.multiplier,
                                                    quantization={"weights": "asymmetric"})}
        variants = {"float": model}
        variants.update({v: builders[v]() for v in VARIANTS if v in chosen})
        _, report = graphswap.rewrite_model(model, kernel="exact", return_report=True)
        print(f"{name}: {report.summary_line()}")
        forwards = [inference_fn(m) for m in variants.values()]
        times = median_times([lambda f=f: f(x).numpy() for f in forwards], reps=10,
                             budget=12.0, rounds=args.rounds)
        rows.append((name, "inference", batch, dict(zip(variants, times))))
        if not args.no_train:
            steps = [train_step_fn(m, loss) for m in variants.values()]
            times = median_times([lambda s=s: s(x, y).numpy() for s in steps], reps=10,
                                 budget=12.0, rounds=args.rounds)
            rows.append((name, "train step", batch, dict(zip(variants, times))))
    print()

    def ms(t):
        return f"{t * 1e3:.1f}" if t is not None else "-"

    def ratio(t, base):
        return f"{t / base:.2f}" if t is not None else "-"

    header = (f"{'model':<13}{'measure':<12}{'batch':>6}{'float ms':>11}{'exact ms':>11}"
              f"{'LUT ms':>11}{'exact/float':>13}{'LUT/float':>11}{'LUT images/s':>14}"
              f"{'static/float':>14}{'asym/float':>12}")
    print(header)
    print("-" * len(header))
    for name, measure, batch, t in rows:
        base, lut = t["float"], t.get("lut")
        rate = f"{batch / lut:.1f}" if lut is not None else "-"
        print(f"{name:<13}{measure:<12}{batch:>6}{ms(base):>11}{ms(t.get('exact')):>11}"
              f"{ms(lut):>11}{ratio(t.get('exact'), base):>13}{ratio(lut, base):>11}"
              f"{rate:>14}{ratio(t.get('static'), base):>14}{ratio(t.get('asym'), base):>12}")
    print(f"LUT: {args.multiplier} with graphswap's default sign-magnitude weights, per-call "
          f"ranges; static: the same calibrated (static ranges); asym: the same multiplier with "
          f"TFApprox's asymmetric weights")


if __name__ == "__main__":
    main()
