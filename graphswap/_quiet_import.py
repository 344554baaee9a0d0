"""Importing TensorFlow without its native start-up messages.

TensorFlow's C++ side prints CUDA-probing and CPU-feature lines to file descriptor 2 before its
logging is configured, whatever TF_CPP_MIN_LOG_LEVEL says, and "failed call to cuInit" when it first
probes for GPUs on a machine without one; in a command-line tool they bury the
report.  Unless the user asked to see them (TF_CPP_MIN_LOG_LEVEL below 2, or GRAPHSWAP_DEBUG), the
first import runs with descriptor 2 pointed at /dev/null; an import error is re-raised after the
descriptor is restored, so it is never hidden.
"""

from __future__ import annotations

import os
import sys


def import_tensorflow_quietly() -> None:
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if os.environ.get("GRAPHSWAP_DEBUG") or os.environ["TF_CPP_MIN_LOG_LEVEL"] not in ("2", "3"):
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable descriptor 2 (embedded interpreters)
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            import tensorflow

            # Probing for GPUs prints "failed call to cuInit" on machines without one; do it
            # here, silently.  Listing physical devices does not initialise the runtime, so
            # logical devices can still be configured afterwards.
            tensorflow.config.list_physical_devices("GPU")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
