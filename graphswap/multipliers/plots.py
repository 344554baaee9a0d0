"""The error heat map of a multiplier (`graphswap kernels check --plot`)."""

from __future__ import annotations

import os

import numpy as np

from graphswap.multipliers.metrics import lut
from graphswap.multipliers.record import Multiplier, operand_values


def plot_error_heatmap(multiplier: Multiplier, path) -> str:
    """Write a PNG heatmap of approx - exact over all operand pairs; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = operand_values(multiplier.signed)
    order = np.argsort(values)
    error = (lut(multiplier) - (values[order][:, None] * values[order][None, :])).astype(np.float64)
    limit = max(float(np.abs(error).max()), 1.0)
    lo, hi = int(values.min()), int(values.max())
    fig, ax = plt.subplots(figsize=(6.4, 5.4), dpi=100)
    image = ax.imshow(error, cmap="RdBu_r", vmin=-limit, vmax=limit, origin="lower",
                      extent=(lo - 0.5, hi + 0.5, lo - 0.5, hi + 0.5), interpolation="nearest")
    ax.set_xlabel("second operand b (weight)")
    ax.set_ylabel("first operand a (activation)")
    ax.set_title(f"{multiplier.name}: approx - exact")
    fig.colorbar(image, ax=ax, label="error")
    fig.tight_layout()
    path = os.fspath(path)
    tmp = path + ".tmp.png"
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path

