#!/usr/bin/env python
"""One epoch of fine-tuning the sample LeNet-5, side by side in one run:

    original        the float model as TensorFlow runs it (the reference),
    swapped-exact   every Dense/Conv2D rewritten to graphswap's exact float32 C kernel,
    swapped-LUT     every Dense/Conv2D rewritten to a table-driven 8-bit multiplier (mul8u_drum4),

all through graphswap.finetune (same data pipeline, batch 128, Adam 1e-4, 1,437 training images of
sample_models/digits.npz, validation on the 360 test images), printing the epoch time and its ratio
to the original.  Each variant trains `--epochs` epochs per round; the first epoch of a run includes
tracing the training function, so the steady-state time is the best later epoch.  Variants
alternate round by round and the best round is kept (the machine may be shared: compare ratios
from one run).

    python benchmarks/bench_finetune.py [--multiplier mul8u_drum4] [--rounds 2] [--epochs 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multiplier", default="mul8u_drum4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    from benchmarks._timing import machine_line
    from graphswap import io as modelio
    from graphswap.research import load_data
    from graphswap.swap import rewrite_model
    from graphswap.research import finetune

    machine = machine_line()  # load average before the runs
    model_path = REPO / "sample_models" / "lenet5.keras"
    data_path = REPO / "sample_models" / "digits.npz"
    original = modelio.load_model(model_path)
    train = load_data(data_path, original, split="train")
    test = load_data(data_path, original, split="test")
    variants = {
        "original": original,
        "swapped-exact": rewrite_model(original, kernel="exact"),
        f"swapped-LUT ({args.multiplier})": rewrite_model(original, kernel=args.multiplier),
    }

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(time.perf_counter() - self.start)

    first = {name: float("inf") for name in variants}
    steady = {name: float("inf") for name in variants}
    accuracy = {}
    for _ in range(args.rounds):
        for name, model in variants.items():
            timer = EpochTimer()
            result = finetune(model, train, val_data=test, epochs=args.epochs,
                              batch_size=args.batch_size, learning_rate=1e-4, seed=0, verbose=0,
                              callbacks=[timer], restore_best=False)
            first[name] = min(first[name], timer.times[0])
            if len(timer.times) > 1:
                steady[name] = min(steady[name], min(timer.times[1:]))
            accuracy[name] = result.history["val_accuracy"][-1]

    print("bench_finetune: one epoch of fine-tuning LeNet-5 on 1,437 images "
          f"(batch {args.batch_size}, {-(-len(train) // args.batch_size)} steps, validation on "
          f"{len(test)} images)")
    print(machine + f", tf intra-op threads: "
          f"{tf.config.threading.get_intra_op_parallelism_threads() or 'default'}")
    print(f"best of {args.rounds} round(s) x {args.epochs} epoch(s); ratio = time / original's")
    header = (f"{'variant':<28} {'1st epoch (s)':>13} {'ratio':>6} {'steady epoch (s)':>16} "
              f"{'ratio':>6} {'val acc':>8}")
    print(header)
    print("-" * len(header))
    for name in variants:
        steady_text = (f"{steady[name]:>16.3f} {steady[name] / steady['original']:>6.2f}"
                       if np.isfinite(steady[name]) else f"{'-':>16} {'-':>6}")
        print(f"{name:<28} {first[name]:>13.3f} {first[name] / first['original']:>6.2f} "
              f"{steady_text} {100 * accuracy[name]:>7.2f}%")


if __name__ == "__main__":
    main()
