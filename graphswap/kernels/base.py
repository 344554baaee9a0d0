"""The Kernel: the forward arithmetic a swapped layer runs, on float32 numpy arrays.

Every kernel offers `matmul(a, b)` and `conv2d(x, w, geometry)`, a canonical `spec` string, and
`to_config()`, its record: the JSON-serialisable dict a saved model's layer config stores
({"spec"} for built-ins, {"spec", "path", "sha256"} for kernels from files).
"""

from __future__ import annotations

import abc

import numpy as np

from graphswap.native import ConvGeometry


class Kernel(abc.ABC):
    """Forward arithmetic of swapped layers, on float32 numpy arrays."""

    #: canonical spec string, accepted by resolve_kernel() to rebuild the same kernel
    spec: str = ""
    #: one-line description for reports and `graphswap kernels`
    description: str = ""

    @abc.abstractmethod
    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(m,k) x (k,n) -> (m,n) float32."""

    @abc.abstractmethod
    def conv2d(self, x: np.ndarray, w: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
        """NHWC input x HWIO filter -> NHWC output, float32, geometry fully explicit."""

    def to_config(self) -> dict:
        return {"spec": self.spec}

    @property
    def hardware_metrics(self) -> dict:
        """Hardware figures (e.g. PDK45_PWR) when the kernel's source carries them."""
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"
