#!/usr/bin/env python
"""Design-space exploration: wall time to a verified Pareto front, and how many full evaluations
it needed against the size of the space.

    LeNet-5 (the shipped sample, its 360 test digits)         x 10 circuits
    ResNet-8 (CIFAR shape 32x32x3, random weights; labels are the float model's own predictions
              on 500 random images, so "accuracy" is agreement with the float model) x 10 circuits

The 10 unsigned circuits: graphswap's example multipliers (sample_models/multipliers/: their
PDK45_PWR lines are estimates from the kept array cells) and 7 built-ins whose powers are ASSUMED
for this benchmark (benchmarks/explore_power.csv: plausible orders of magnitude, not synthesis
results).  Each run starts from an empty study; "verified" means every front point was measured on
the whole validation set.

    python benchmarks/bench_explore.py [--budget 1.0] [--trials N] [--only lenet5|resnet8]
    python benchmarks/bench_explore.py --calibration [--circuits 3] [--trials 12]
        [--bias-correction none|mean|moments]

--calibration: the cost of explore --calibrate (CNN-BN, the shipped sample with
BatchNormalization; calibration on 512 training digits, bias correction "moments" and BatchNorm
re-estimation, or none of them: ranges only): the same search with the activation ranges calibrated once (the default) and
calibrated for every assignment (reuse_calibration=False); both must measure the same numbers.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402

BUILTINS = ["mul8u_trunc2", "mul8u_trunc4", "mul8u_trunc6", "mul8u_drum6", "mul8u_drum5",
            "mul8u_drum4", "mul8u_mitchell"]
EXAMPLES = ["mul8u_gsbam6.c", "mul8u_gsloa11.c", "mul8u_gsot45.c"]


def run(name, model, data, library, args, log):
    import graphswap

    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        result = graphswap.explore(model, data, library, metrics=REPO / "benchmarks" /
                                   "explore_power.csv", budget=args.budget / 100,
                                   trials=args.trials, study=Path(scratch) / "study.db",
                                   estimate_samples=args.estimate_samples, progress=False,
                                   seed=args.seed)
        seconds = time.perf_counter() - start
    counts = result.counts
    best = result.best
    log(f"\n{name}: {len(result.layers)} layers x {len(result.library.circuits)} circuits "
        f"(+ exact) = {counts['space']:,} assignments")
    log(result.format_table())
    log(f"{name}: verified front in {seconds:.1f} s: {counts['full_evaluations_this_run']} full "
        f"evaluations ({counts['full_evaluations_this_run'] / counts['space']:.2e} of the "
        f"exhaustive {counts['space']:,}) + {counts['estimate_evaluations_this_run'] or 0} "
        f"estimate evaluations on {args.estimate_samples} examples; best within "
        f"{args.budget:g} points: "
        + (f"relative power {best['relative_cost']:.3f} at {best['accuracy']:.2%}" if best
           else "none"))


def calibration_cost(args, log):
    import graphswap

    library = BUILTINS[:args.circuits]
    model = REPO / "sample_models" / "cnn_bn.keras"
    data = REPO / "sample_models" / "digits.npz"
    options = {"calibration_data": str(data), "bias_correction": None,
               "recalibrate_bn": False}   # ranges only
    if args.bias_correction != "none":
        options.update(bias_correction=args.bias_correction, recalibrate_bn=True)
    # warm-up (TensorFlow's tracing, the circuits' tables, the data) outside the timings
    graphswap.explore(model, data, library[:1], metrics=REPO / "benchmarks" / "explore_power.csv",
                      budget=1.0, include=["predictions"], progress=False,
                      rewrite_options=options)
    runs = {}
    for reuse in (True, False):
        start = time.perf_counter()
        result = graphswap.explore(model, data, library, metrics=REPO / "benchmarks" /
                                   "explore_power.csv", budget=args.budget / 100,
                                   trials=args.trials or 12, exhaustive_limit=0,
                                   estimate_samples=args.estimate_samples, progress=False,
                                   seed=args.seed, rewrite_options=options,
                                   reuse_calibration=reuse)
        runs[reuse] = (time.perf_counter() - start, result)
    (fast, reused), (slow, fresh) = runs[True], runs[False]
    same = {tuple(p["assignment"].values()): p["accuracy"] for p in reused.points} == \
        {tuple(p["assignment"].values()): p["accuracy"] for p in fresh.points}
    evaluations = reused.counts["full_evaluations_this_run"] + \
        (reused.counts["estimate_evaluations_this_run"] or 0)
    steps = ("" if args.bias_correction == "none" else
             f" + bias correction {args.bias_correction} + BN re-estimation")
    log(f"CNN-BN x {len(library)} circuits, {evaluations} evaluations (estimates included), "
        f"calibration (percentile ranges){steps} on 512 examples:")
    for label, seconds, result in (("ranges once", fast, reused),
                                   ("every assignment", slow, fresh)):
        log(f"  {label:17s} {seconds:7.1f} s in all, {result.counts['calibration_seconds']:7.1f} "
            f"s calibrating/compensating")
    log(f"  same measured accuracies: {same}; ranges reused: "
        f"{reused.counts['calibration_reused']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=1.0, help="points")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--estimate-samples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["lenet5", "resnet8"], default=None)
    parser.add_argument("--calibration", action="store_true",
                        help="measure the cost of --calibrate with and without reuse")
    parser.add_argument("--circuits", type=int, default=3, help="with --calibration")
    parser.add_argument("--bias-correction", choices=["none", "mean", "moments"],
                        default="moments", help="with --calibration")
    args = parser.parse_args()
    if args.calibration:
        calibration_cost(args, print)
        return

    import keras

    from _timing import machine_line, run_context
    from _models import resnet8

    print(run_context())
    print(machine_line())
    library = BUILTINS + [str(REPO / "sample_models" / "multipliers" / f) for f in EXAMPLES]
    if args.only in (None, "lenet5"):
        run("LeNet-5", keras.models.load_model(REPO / "sample_models" / "lenet5.keras"),
            REPO / "sample_models" / "digits.npz", library, args, print)
    if args.only in (None, "resnet8"):
        model = resnet8(args.seed)
        x = np.random.default_rng(args.seed).uniform(0, 1, (500, 32, 32, 3)).astype(np.float32)
        y = np.argmax(model.predict(x, batch_size=128, verbose=0), axis=1)
        run("ResNet-8", model, (x, y), library, args, print)


if __name__ == "__main__":
    main()
