#!/usr/bin/env python
"""How much one image's result depends on the batch it is in, per quantization mode.

    python benchmarks/batch_dependence.py [--kernel mul8u_drum4 --kernel mul8s_drum4 ...] [--images 500]

Every Dense/Conv2D layer of the shipped LeNet-5 (sample_models/lenet5.keras) is swapped to each
kernel; the first N images of sample_models/digits.npz (test images, then training images) are run
once as one batch of N and once one image at a time.  For each kernel it prints how many images
get another predicted class alone than inside the batch, the largest and mean change of a logit
(the last layer's output before its softmax), and the accuracy both ways.

Each multiplier runs in three modes: "tfapprox" (TFApprox's asymmetric per-tensor weights, dynamic
activations), "dynamic" (graphswap's default weights, dynamic activations) and "static"
(activation ranges calibrated on the first 512 training images, saved in the layers).  Dynamic
modes choose the activation scale (and, unsigned, the zero point) per call from the values in the
batch (graphswap/kernels/quantized.py), so an image's codes depend on the other images; static
ranges do not.  `exact` (float32) is the control: round-off only.  Not a timing: the numbers are
deterministic, the same on every run.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import REPO, use_repository_package  # noqa: E402

use_repository_package()

import numpy as np  # noqa: E402

DEFAULT_KERNELS = ["exact", "mul8u_exact", "mul8s_exact", "mul8u_drum4", "mul8s_drum4"]


def logits_model(model):
    """The same model with its last layer's softmax removed (outputs are logits)."""
    import keras

    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    last = clone.layers[-1]
    if getattr(last, "activation", None) is keras.activations.softmax:
        last.activation = keras.activations.linear
    return clone


MODES = {"tfapprox": {"quantization": "tfapprox"}, "dynamic": {}, "static": None}


def measure(kernel: str, mode: str, images: np.ndarray, labels: np.ndarray,
            calibration: np.ndarray) -> dict:
    import graphswap

    original = graphswap.load_model(REPO / "sample_models" / "lenet5.keras")
    # static: calibrated ranges alone (compensation, the default with calibration data, is off)
    options = MODES[mode] if MODES[mode] is not None else {"calibration_data": calibration,
                                                           "bias_correction": None}
    model = logits_model(graphswap.rewrite_model(original, kernel=kernel, **options))
    together = np.asarray(model(images, training=False))
    alone = np.concatenate([np.asarray(model(images[i:i + 1], training=False))
                            for i in range(len(images))])
    change = np.abs(alone - together)
    return {"kernel": kernel, "mode": mode, "images": len(images),
            "accuracy_together": float(np.mean(together.argmax(1) == labels)),
            "accuracy_alone": float(np.mean(alone.argmax(1) == labels)),
            "class_changes": int(np.count_nonzero(alone.argmax(1) != together.argmax(1))),
            "max_logit_change": float(change.max()), "mean_logit_change": float(change.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", help="kernel to measure (repeatable)")
    parser.add_argument("--images", type=int, default=500, help="batch size N")
    args = parser.parse_args()
    with np.load(REPO / "sample_models" / "digits.npz") as digits:
        pool = np.concatenate([digits["x_test"], digits["x_train"]]).astype(np.float32)
        targets = np.concatenate([digits["y_test"], digits["y_train"]])
        calibration = digits["x_train"][:512].astype(np.float32)
    images, labels = pool[:args.images], targets[:args.images]
    print(f"LeNet-5 on {len(images)} digits images: each image alone vs inside one batch of "
          f"{len(images)}")
    print(f"{'kernel':<12} {'mode':<9} {'class changes':>14} {'max |d logit|':>14} "
          f"{'mean |d logit|':>15} {'accuracy in batch':>18} {'alone':>7}")
    for kernel in args.kernel or DEFAULT_KERNELS:
        for mode in (["dynamic"] if kernel == "exact" else list(MODES)):
            row = measure(kernel, mode, images, labels, calibration)
            print(f"{kernel:<12} {mode if kernel != 'exact' else '-':<9} "
                  f"{row['class_changes']:>8} of {row['images']:<3} "
                  f"{row['max_logit_change']:>14.3g} {row['mean_logit_change']:>15.3g} "
                  f"{row['accuracy_together']:>17.2%} {row['accuracy_alone']:>7.2%}")


if __name__ == "__main__":
    main()
