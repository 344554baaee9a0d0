#!/usr/bin/env python
"""Recovery rows for 8xN multipliers (docs/RECOVERY.md, "Arithmetic beyond 8x8"): what an 8-bit
activation x N-bit weight multiplier costs the shipped LeNet-5 on the digits, and what the
zero-step tools and one epoch of fine-tuning win back.

Model and data as benchmarks/recovery_table.py: sample_models/lenet5.keras on
sample_models/digits.npz (1,437 training / 360 test images; one test image = 0.28 points);
calibration and bias compensation on the first 512 training images (graphswap's defaults);
fine-tuning 1 epoch on all training images from the compensated model (graphswap.finetune's
default recipe, seed 0, straight-through gradients); accuracy on the 360 test images.

Rows: the exact 8x8 multiplier (the reference), exact 8x4 and 8x2 multipliers (written here: only
the 4- / 2-bit weights cost anything), and the shipped examples mul8x4u_gsbam4.c and
mul8x2u_gsbam3.c.  Columns: float | dynamic (per-call activation ranges) | calibrated (static
ranges) | + bias comp. | STE 1 (fine-tuned one epoch).

    python benchmarks/recovery_8xn.py            # about ten minutes on 2 shared cores

Nx8 rows (a 4-bit activation x an 8-bit weight: an exact 4x8 multiplier written here, and the
shipped mul4x8u_gsbam4.c), one row per run if you like:

    python benchmarks/recovery_8xn.py --nx8 [--row NAME]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import graphswap  # noqa: E402
from graphswap import kernels  # noqa: E402

EXACT_NX8 = """#include <stdint.h>
uint64_t mul4x8u_exact(const uint64_t A /* 4-bit unsigned operand */,
                       const uint64_t B /* 8-bit unsigned operand */)
{ return (A & 15u) * (B & 255u); }
"""

EXACT = """#include <stdint.h>
uint64_t mul8x{n}u_exact(const uint64_t A /* 8-bit unsigned operand */,
                       const uint64_t B /* {n}-bit unsigned operand */)
{{ return (A & 255u) * (B & {mask}u); }}
"""


def _nx8_specs(folder: Path) -> list:
    path = folder / "mul4x8u_exact.c"
    path.write_text(EXACT_NX8)
    shipped = REPO / "sample_models" / "multipliers" / "mul4x8u_gsbam4.c"
    for file in (path, shipped):
        graphswap.trust(str(file))
    return [("exact 4x8", str(path)), (shipped.name, str(shipped))]


def main(argv=None) -> None:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nx8", action="store_true", help="the Nx8 rows (4-bit activations)")
    parser.add_argument("--row", help="only the row of this name (e.g. 'exact 4x8')")
    args = parser.parse_args(argv)
    data = np.load(REPO / "sample_models" / "digits.npz")
    x_train, y_train = data["x_train"], data["y_train"]
    x_test, y_test = data["x_test"], data["y_test"]
    model = keras.models.load_model(REPO / "sample_models" / "lenet5.keras")
    folder = Path(tempfile.mkdtemp(prefix="graphswap-8xn-"))
    specs = [("mul8u_exact (8x8)", "mul8u_exact")]
    for n in (() if args.nx8 else (4, 2)):
        path = folder / f"mul8x{n}u_exact.c"
        path.write_text(EXACT.format(n=n, mask=2 ** n - 1))
        graphswap.trust(str(path))
        specs.append((f"exact 8x{n}", str(path)))
        shipped = REPO / "sample_models" / "multipliers" / (
            "mul8x4u_gsbam4.c" if n == 4 else "mul8x2u_gsbam3.c")
        graphswap.trust(str(shipped))
        specs.append((shipped.name, str(shipped)))
    if args.nx8:
        specs += _nx8_specs(folder)
    if args.row:
        specs = [(name, spec) for name, spec in specs if name == args.row]

    def accuracy(m) -> float:
        predictions = m.predict(x_test, batch_size=128, verbose=0)
        return 100.0 * float(np.mean(np.argmax(predictions, axis=1) == y_test))

    float_accuracy = accuracy(model)
    operand = "activations" if args.nx8 else "weights"
    print(f"| multiplier | {operand} | MAE% | float | dynamic | calibrated | + bias comp. | "
          f"STE 1 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, spec in specs:
        multiplier = kernels.resolve_kernel(spec).multiplier
        mae = graphswap.multipliers.metrics(multiplier)["MAE%"]
        dynamic = accuracy(graphswap.rewrite_model(model, kernel=spec))
        # calibration alone: compensation is the default whenever calibration data is given
        calibrated = accuracy(graphswap.rewrite_model(model, kernel=spec,
                                                      calibration_data=x_train[:512],
                                                      bias_correction=None))
        compensated_model = graphswap.rewrite_model(
            model, kernel=spec, calibration_data=x_train[:512],
            bias_correction=graphswap.research.DEFAULT_BIAS_CORRECTION)
        compensated = accuracy(compensated_model)
        tuned = graphswap.finetune(compensated_model, (x_train, y_train), epochs=1, seed=0,
                                   verbose=0, restore_best=False)
        bits = multiplier.activation_bits if args.nx8 else multiplier.weight_bits
        print(f"| {name} | {bits}-bit | {mae:.2f} | {float_accuracy:.2f} | "
              f"{dynamic:.2f} | {calibrated:.2f} | {compensated:.2f} | "
              f"{accuracy(tuned.model):.2f} |", flush=True)


if __name__ == "__main__":
    main()
