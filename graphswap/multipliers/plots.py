"""The error heat map of a multiplier (`graphswap kernels check --plot`)."""

from __future__ import annotations

import os

import numpy as np

from graphswap.multipliers.metrics import errors, operand_axes
from graphswap.multipliers.record import Multiplier


def plot_error_heatmap(multiplier: Multiplier, path) -> str:
    """Write a PNG heatmap of approx - exact over all operand pairs (256 x 2^N for an 8xN
    multiplier), both axes in value order; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, second = operand_axes(multiplier)
    rows, cols = np.argsort(first), np.argsort(second)
    error = errors(multiplier)[2][np.ix_(rows, cols)].astype(np.float64)
    limit = max(float(np.abs(error).max()), 1.0)
    extent = (int(second.min()) - 0.5, int(second.max()) + 0.5,
              int(first.min()) - 0.5, int(first.max()) + 0.5)
    fig, ax = plt.subplots(figsize=(6.4, 5.4), dpi=100)
    image = ax.imshow(error, cmap="RdBu_r", vmin=-limit, vmax=limit, origin="lower",
                      extent=extent, interpolation="nearest",
                      aspect="equal" if multiplier.width == "8x8" else "auto")
    ax.set_xlabel("second operand b (weight)" if multiplier.weight_bits == 8
                  else f"second operand b ({multiplier.weight_bits}-bit weight)")
    ax.set_ylabel("first operand a (activation)" if multiplier.activation_bits == 8
                  else f"first operand a ({multiplier.activation_bits}-bit activation)")
    ax.set_title(f"{multiplier.name}: approx - exact")
    fig.colorbar(image, ax=ax, label="error")
    fig.tight_layout()
    path = os.fspath(path)
    tmp = path + ".tmp.png"
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path

