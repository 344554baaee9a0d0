"""Label-free fine-tuning by distillation against label-based fine-tuning, on the shipped LeNet-5
and digits (docs/RECOVERY.md, "Fine-tuning without labels").

From the zero-step start of the recovery table (static calibration on the training images and
the default bias compensation), each multiplier's model is fine-tuned with the default recipe
(Adam, learning rate auto, cosine decay, batch 128) for 1 and 3 epochs on the 1,437 training
images, once on their labels and once with `teacher="original"` (the float model's outputs,
labels unused), and scored on the 360 test images: top-1 accuracy and agreement with the float
model.  Prints the CPU and one markdown table.

    python benchmarks/distillation.py [--multipliers mul8u_drum4 ...] [--epochs 1 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time

from graphswap import kernels
from graphswap.io import load_model
from graphswap.research import DEFAULT_BIAS_CORRECTION, calibration_arrays, finetune, load_data
from graphswap.research.data.scoring import predict
from graphswap.research.data.task import derive_task
from graphswap.swap import rewrite_model

MODEL = "sample_models/lenet5.keras"
DATA = "sample_models/digits.npz"
MULTIPLIERS = ("mul8u_drum4", "sample_models/multipliers/mul8s_gsot36.c")


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multipliers", nargs="+", default=list(MULTIPLIERS))
    parser.add_argument("--epochs", nargs="+", type=int, default=[1, 3])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for spec in args.multipliers:
        if spec.endswith(".c"):
            kernels.trust_file(spec)
    model = load_model(MODEL)
    task = derive_task(model)
    test = load_data(DATA, model, split="test", task=task)
    labels = test.labels()
    reference = predict(model, test)
    calibration = calibration_arrays(DATA, model)

    def scored(candidate):
        metrics = task.evaluate(predict(candidate, test), labels, reference)
        return f"{100 * metrics['accuracy']:.2f} ({100 * metrics['agreement']:.1f})"

    print(f"CPU: {cpu_name()}")
    print(f"float LeNet-5: {scored(model)} test accuracy (agreement with float) on {len(test)} "
          f"test images")
    headers = ["multiplier", "start"] + [f"{how} {epochs} ep" for epochs in args.epochs
                                         for how in ("labels", "teacher")]
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for spec in args.multipliers:
        start = rewrite_model(model, kernel=spec, calibration_data=calibration,
                              bias_correction=DEFAULT_BIAS_CORRECTION)
        cells = [spec.split("/")[-1], scored(start)]
        for epochs in args.epochs:
            for teacher in (None, "original"):
                began = time.perf_counter()
                result = finetune(start, DATA, epochs=epochs, seed=args.seed, verbose=0,
                                  teacher=teacher)
                seconds = time.perf_counter() - began
                cells.append(f"{scored(result.model)} [{seconds:.0f} s]")
        print("| " + " | ".join(cells) + " |", flush=True)
    print("cells: test accuracy % (agreement with the float model's top-1 %) [fine-tuning "
          "seconds]")


if __name__ == "__main__":
    main()
