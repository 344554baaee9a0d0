"""Timing helpers shared by the benchmark scripts (not part of the package)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def use_repository_package() -> None:
    """Import graphswap from this checkout when it is not installed (benchmarks run either way)."""
    try:
        import graphswap  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO))


def median_times(fns, reps: int = 50, budget: float = 3.0, rounds: int = 3) -> list[float]:
    """Seconds per call of each fn, measured side by side in one process.

    Each fn runs as a block (warm-up, then a median over repeated calls), the fns alternate block
    by block for `rounds` rounds, and the best block per fn is kept.  Blocks rather than single
    alternating calls, because TensorFlow's pool keeps spinning briefly after each op and an
    alternating loop would mostly measure the two pools disturbing each other; several rounds,
    best kept, because on a shared machine the load changes during a run.
    """
    best = [float("inf")] * len(fns)
    per_round = budget / rounds / len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            for _ in range(3):
                fn()
            start = time.perf_counter()
            fn()
            estimate = time.perf_counter() - start
            count = max(5, min(reps, int(per_round / max(estimate, 1e-7))))
            samples = []
            for _ in range(count):
                start = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - start)
            best[i] = min(best[i], float(np.median(samples)))
    return best


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (from /proc/cpuinfo on Linux): a
    virtual machine may name only the brand ("AMD EPYC"), the numbers tell its generation."""
    try:
        fields = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        if "model name" in fields:
            numbers = [f"{key} {fields[key]}" for key in ("cpu family", "model") if key in fields]
            return fields["model name"] + (f" ({', '.join(numbers)})" if numbers else "")
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def print_step_ratios(results: dict, base: str) -> None:
    """One line per variant of {name: (inference seconds, training step seconds)}, each with its
    ratio to the `base` variant's times."""
    inference0, training0 = results[base]
    for name, (inference, training) in results.items():
        print(f"  {name:<28s} inference {inference * 1e3:9.2f} ms ({inference / inference0:6.1f}x "
              f"float)   training step {training * 1e3:9.2f} ms ({training / training0:6.1f}x float)")


def run_context() -> str:
    """The line every benchmark prints first: the CPU model, graphswap's code path (ISA) and the
    BLAS behind its float kernels, and where its kernel library is."""
    from graphswap import native
    from graphswap.swap import forward_op

    library = native.shipped_library()
    op = forward_op.op_library()
    bridge = (f"compiled TensorFlow op {op.path.name}" if op is not None
              else "tf.numpy_function")
    # OpenBLAS settings from the environment (a forced core, cache sizes) change its speed
    settings = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("OPENBLAS_"))
    blas_env = f" (environment: {', '.join(settings)})" if settings else ""
    return (f"CPU: {cpu_model()}; graphswap ISA path: {library.isa} (this CPU runs "
            f"{', '.join(library.supported_isas)}); float BLAS: {library.blas_info}{blas_env}; "
            f"library {library.path}; kernel calls through: {bridge}")


def table_path_line(spec: str) -> str:
    """Which code path a multiplier's table products take: the float GEMMs of its exact factors
    (a table T[a][b] = f(a) g(b): DRUM, operand truncation) or the ISA's table kernels."""
    from graphswap import native
    from graphswap.kernels import resolve_multiplier

    library = native.shipped_library()
    if library.table_factored(resolve_multiplier(spec).table):
        return (f"{spec}: its table factors, T[a][b] = f(a) g(b): float32 GEMMs / convolutions of "
                f"the mapped operands (exact), not the table kernels")
    return f"{spec}: the {library.isa} table kernels (its table does not factor)"


def machine_line() -> str:
    import tensorflow as tf

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"tensorflow {tf.__version__}, numpy {np.__version__}, cores: {os.cpu_count()}, "
            f"load average at start: {load:.2f}")
