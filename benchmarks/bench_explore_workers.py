#!/usr/bin/env python
"""Several explore workers on one study: wall time to the front with 1 worker and with N workers
(separate studies, the same search), and whether their fronts are the same.

    LeNet-5 (the shipped sample, its 360 test digits), conv1/conv2/fc1 on a library of three
    built-in circuits (4^3 = 64 assignments, enumerated), the other layers exact.

Each run starts from an empty SQLite study; the N workers are `graphswap explore` processes
started together on the same study file, as on a cluster (docs/EXPLORE.md).  On a machine with
fewer cores than workers the workers share them, so the gain is bounded by the cores.

    python benchmarks/bench_explore_workers.py [--workers 2]
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
from _timing import cpu_model, use_repository_package  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CIRCUITS = ["mul8u_trunc4", "mul8u_drum4", "mul8u_drum3"]
POWER = {"exact": 0.40, "mul8u_trunc4": 0.33, "mul8u_drum4": 0.20, "mul8u_drum3": 0.12}


def run_workers(count: int, folder: Path, data: Path, table: Path) -> tuple[float, list]:
    """Start `count` explore processes on one new study; (wall seconds, each worker's front)."""
    study = folder / f"study-{count}.db"
    command = [sys.executable, "-m", "graphswap.cli", "explore",
               str(REPO / "sample_models" / "lenet5.keras"), "--data", str(data),
               "--metrics", str(table), "--include", "^(conv1|conv2|fc1)$",
               "--study", str(study), "--estimate-samples", "120"]
    for circuit in CIRCUITS:
        command += ["--library", circuit]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    start = time.perf_counter()
    processes = [subprocess.Popen(command + ["-o", str(folder / f"front-{count}-{i}.json")],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True) for i in range(count)]
    for process in processes:
        _, errors = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"a worker failed:\n{errors}")
    seconds = time.perf_counter() - start
    fronts = []
    for i in range(count):
        document = json.loads((folder / f"front-{count}-{i}.json").read_text())
        fronts.append([(tuple(p["assignment"].values()), p["accuracy"], p["relative_cost"])
                       for p in document["front"]])
    return seconds, fronts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    use_repository_package()
    print(f"CPU: {cpu_model()}; cores: {os.cpu_count()}; load average at start: "
          f"{os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with np.load(REPO / "sample_models" / "digits.npz") as archive:
            np.savez(folder / "val.npz", x=archive["x_test"], y=archive["y_test"])
        table = folder / "power.csv"
        table.write_text("name,power\n" + "".join(f"{k},{v}\n" for k, v in POWER.items()))
        one_seconds, (one_front,) = run_workers(1, folder, folder / "val.npz", table)
        many_seconds, fronts = run_workers(args.workers, folder, folder / "val.npz", table)
    same = all(front == one_front for front in fronts)
    print(f"{'workers':>8} {'wall s':>8} {'speed-up':>9} {'front points':>13}")
    print(f"{1:>8} {one_seconds:>8.1f} {1.0:>9.2f} {len(one_front):>13}")
    print(f"{args.workers:>8} {many_seconds:>8.1f} {one_seconds / many_seconds:>9.2f} "
          f"{len(fronts[0]):>13}")
    print(f"every worker's front equals the single worker's: {same}")


if __name__ == "__main__":
    main()
