#!/usr/bin/env python
"""Recovery on a real, harder task, through the command line exactly as a new user runs it: the
published MLPerf Tiny ResNet-8 (tf.keras .h5, raw 0..255 inputs, softmax over 10 classes) on real
CIFAR-10 images, four multipliers in every layer (the numbers of docs/RECOVERY.md,
"CIFAR-10 with the MLPerf Tiny ResNet-8").

Material (not written by this project; pass its folder as --data-dir - the default,
../shared/data beside the checkout, is where it is on the developers' machine):
  mlperf_tiny_resnet8.h5     the published model, unchanged
  cifar10_train_part.npz     3,805 real CIFAR-10 training images, class indices
The images are split once, seeded: --test-size held-out images judge every recipe (no recipe
sees them), the rest are the training data (`convert --calibrate`, `finetune --data`).  The model
was trained on the full CIFAR-10 training set, so its float accuracy on these held-out training
images (about 91%) is above its published test accuracy (about 88%); the drops are what compare.

Multipliers: EvoApproxLib's mul8u_FTA, mul8s_1L1G (medium) and mul8u_13QR, mul8s_1KR3 (severe)
from --multipliers DIR (EvoApproxLib's .c files, MIT licence, not shipped here); without it,
graphswap's own example circuits of the same kinds (sample_models/multipliers: mul8u_gsloa11,
mul8s_gsloa11 medium; mul8u_gsot45, mul8s_gsot36 severe).

Recipes (each a command line; every row is `graphswap evaluate` of the model it writes):
  dynamic        convert (no calibration: activations quantized per call, as TFApprox)
  previous       convert --calibrate train.npz --operands activation-first --no-dynamic-fallback
                 --calibration-source float --no-weight-tuning --calibration-method
                 percentile (the previous defaults)
  default        convert --calibrate train.npz                     (today's default)
  +wt            convert --calibrate train.npz --weight-tuning     (always, not measured)
  +float         convert --calibrate train.npz --calibration-source float
  lutgrad        convert --calibrate train.npz --backward lut_grad (the start for ft:lutgrad)
  output         convert --calibrate train.npz --calibration-method output (the default now)
  pct            convert --calibrate train.npz --calibration-method percentile (the default
                 until the output method was measured)
  ft:NAME        finetune NAME.keras --data train.npz --epochs E  (the CLI's default recipe)
  ft-prev:NAME   finetune ... --batch-size 128 --lr 1e-3 (what the previous defaults did
                 on this model), and the other flags of FINETUNE_RECIPES

    python benchmarks/recovery_cifar.py --multipliers ~/evoapproxlib       # about 1.5 h, 2 cores
    python benchmarks/recovery_cifar.py --quick                            # one multiplier
    python benchmarks/recovery_cifar.py --recipes dynamic,default,ft:default --json out.json

Results are cached in --json (a rerun computes only what is missing; --fresh starts over).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import REPO, run_context, use_repository_package  # noqa: E402

use_repository_package()

EVOAPPROX = {"mul8u_FTA": "medium", "mul8s_1L1G": "medium", "mul8u_13QR": "severe",
             "mul8s_1KR3": "severe"}
OWN = {"mul8u_gsloa11": "medium", "mul8s_gsloa11": "medium", "mul8u_gsot45": "severe",
       "mul8s_gsot36": "severe"}
ZERO_STEP = {
    "dynamic": None,
    "previous": ["--operands", "activation-first", "--no-dynamic-fallback",
                 "--calibration-source", "float", "--no-weight-tuning",
                 "--calibration-method", "percentile"],
    "default": [],
    "+wt": ["--weight-tuning"],
    "+float": ["--calibration-source", "float"],
    "lutgrad": ["--backward", "lut_grad"],
    "output": ["--calibration-method", "output"],
    "pct": ["--calibration-method", "percentile"],   # the default before the output method
}
FINETUNE_RECIPES = {
    "ft": [],                                        # the CLI's defaults
    "ft-prev": ["--batch-size", "128", "--lr", "1e-3"],  # what the previous defaults ran
                                                     # on this model (auto picked 1e-3 for all)
    "ft-b128": ["--batch-size", "128"],
    "ft-lr1e-3": ["--lr", "1e-3"],
    "ft-lr1e-4": ["--lr", "1e-4"],
    "ft-kd": ["--teacher", "original"],              # distillation instead of the labels
    "ft-kdmix": ["--teacher", "original", "--teacher-weight", "0.5"],  # distillation + labels
    "ft-lutgrad": [],                                # from a start converted with lut_grad
}
DEFAULT_RECIPES = ("dynamic", "previous", "default", "ft-prev:previous", "ft:default")


def split_data(data_dir: Path, work: Path, test_size: int, seed: int = 0) -> tuple[Path, Path]:
    parts = np.load(data_dir / "cifar10_train_part.npz")
    x, y = parts["x_train"], parts["y_train"].reshape(-1)
    order = np.random.default_rng(seed).permutation(len(x))
    test, train = order[:test_size], order[test_size:]
    np.savez(work / "train.npz", x=x[train], y=y[train])
    np.savez(work / "test.npz", x=x[test], y=y[test])
    return work / "train.npz", work / "test.npz"


def graphswap(*args, env=None) -> str:
    command = [sys.executable, "-m", "graphswap_command", *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def accuracy(model: Path, test: Path, env) -> float:
    result = json.loads(graphswap("evaluate", model, "--data", test, "--json", env=env))
    return 100.0 * result["rows"][0]["accuracy"]


def zero_step(name, args, source, kernel, train, work, env) -> tuple[Path, list[str]]:
    output = work / f"{Path(kernel).stem}_{name.strip('+')}.keras"
    calibration = [] if args is None else ["--calibrate", train, *args]
    printed = graphswap("convert", source, "--kernel", kernel, *calibration, "-o", output,
                        "--force", env=env)
    notes = [line for line in printed.splitlines()
             if line.startswith(("operand wiring", "zero-step check"))]
    return output, notes


def run(args) -> dict:
    data_dir = Path(args.data_dir)
    if not (data_dir / "mlperf_tiny_resnet8.h5").exists():
        print(f"no {data_dir / 'mlperf_tiny_resnet8.h5'}: this benchmark needs the published "
              f"MLPerf Tiny ResNet-8 and CIFAR-10 images (pass their folder as --data-dir)")
        sys.exit(0)
    cache = Path(args.json)
    results = {} if args.fresh or not cache.exists() else json.loads(cache.read_text())
    work = Path(args.work or tempfile.mkdtemp(prefix="recovery_cifar_"))
    work.mkdir(parents=True, exist_ok=True)
    train, test = split_data(data_dir, work, args.test_size)
    env = dict(os.environ)
    env.setdefault("GRAPHSWAP_CONFIG_DIR", str(work / "config"))
    source = data_dir / "mlperf_tiny_resnet8.h5"
    if args.multipliers:
        folder = Path(args.multipliers).expanduser()
        kernels = {name: folder / f"{name}.c" for name in EVOAPPROX}
        severity = EVOAPPROX
    else:
        folder = REPO / "sample_models" / "multipliers"
        kernels = {name: folder / f"{name}.c" for name in OWN}
        severity = OWN
    if args.quick:
        kernels = dict(list(kernels.items())[:1])
    if args.only:
        kernels = {name: path for name, path in kernels.items() if name in args.only.split(",")}
    recipes = args.recipes.split(",")
    key = "float"
    if key not in results:
        results[key] = accuracy(source, test, env)
    print(f"float (the published model): {results[key]:.1f}% on {args.test_size} held-out "
          f"images", flush=True)
    for name, kernel in kernels.items():
        entry = results.setdefault(name, {"severity": severity[name]})
        if "mae" not in entry:
            metrics = json.loads(subprocess.run(
                [sys.executable, "-c", "import json, graphswap, sys; "
                 "print(json.dumps(graphswap.kernels.metrics(sys.argv[1])))", str(kernel)],
                capture_output=True, text=True, env=env, check=True).stdout)
            entry["mae"] = metrics.get("MAE%")
        models = {}
        for recipe in recipes:
            base = recipe.split(":")[-1]
            tune = recipe.split(":")[0] if ":" in recipe else None
            if recipe in entry:
                continue
            started = time.perf_counter()
            if base not in models:
                models[base], notes = zero_step(base, ZERO_STEP[base], source, kernel, train,
                                                work, env)
                entry.setdefault("notes", {})[base] = notes
            if tune is None:
                entry[recipe] = accuracy(models[base], test, env)
            else:
                tuned = work / f"{Path(kernel).stem}_{base.strip('+')}_{tune}.keras"
                graphswap("finetune", models[base], "--data", train, "--epochs", args.epochs,
                          *FINETUNE_RECIPES[tune], "-o", tuned, "--force", env=env)
                entry[recipe] = accuracy(tuned, test, env)
            entry.setdefault("seconds", {})[recipe] = round(time.perf_counter() - started, 1)
            cache.write_text(json.dumps(results, indent=2))
            print(f"  {name} {recipe}: {entry[recipe]:.1f}%", flush=True)
    return results


def table(results: dict, recipes: list[str]) -> str:
    float_acc = results["float"]
    header = ["multiplier", "MAE%", *recipes]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, entry in results.items():
        if name == "float":
            continue
        cells = [f"{name} ({entry['severity']})", f"{entry.get('mae', float('nan')):.2f}"]
        for recipe in recipes:
            value = entry.get(recipe)
            cells.append("-" if value is None else f"{value:.1f} ({value - float_acc:+.1f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--multipliers", help="folder with EvoApproxLib's mul8u_FTA.c, "
                                              "mul8s_1L1G.c, mul8u_13QR.c, mul8s_1KR3.c")
    parser.add_argument("--recipes", default=",".join(DEFAULT_RECIPES))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "recovery_cifar.json"))
    parser.add_argument("--work", help="folder for the split data and the models written")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--quick", action="store_true", help="the first multiplier only")
    parser.add_argument("--only", help="these multipliers (comma-separated names) only")
    args = parser.parse_args()
    print(run_context())
    results = run(args)
    print()
    print(f"test accuracy % on {args.test_size} held-out images (difference to float "
          f"{results['float']:.1f}%); every column a CLI command line, module docstring")
    print(table(results, args.recipes.split(",")))
    for name, entry in results.items():
        for recipe, notes in (entry.get("notes") or {}).items() if name != "float" else ():
            for note in notes:
                print(f"  {name} {recipe}: {note[:300]}")


if __name__ == "__main__":
    main()
