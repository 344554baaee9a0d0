"""The Kernel: the forward arithmetic a swapped layer runs, on float32 numpy arrays.

Every kernel offers `matmul(a, b, quant=None)` and `conv2d(x, w, geometry, quant=None)`, a
canonical `spec` string, and
`to_config()`, its record: the JSON-serialisable dict a saved model's layer config stores
({"spec"} for built-ins, {"spec", "path", "sha256"} for kernels from files).

`quant` is the calling layer's QuantScheme (graphswap/kernels/scheme.py): how an 8-bit multiplier
kernel quantizes.  Float kernels ignore it (`quantizes` is False for them); callers pass it only
when it is not None, so a kernel written against the older two-argument interface keeps working.
"""

from __future__ import annotations

import abc

import numpy as np

from graphswap.errors import ShapeError
from graphswap.native import ConvGeometry


def matmul_operands(a, b) -> tuple[np.ndarray, np.ndarray]:
    """a (m, k) and b (k, n) as float32 arrays; ShapeError when they do not agree."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(f"matmul shapes do not agree: {a.shape} x {b.shape}; expected "
                         f"(m, k) x (k, n)")
    return a, b


class Kernel(abc.ABC):
    """Forward arithmetic of swapped layers, on float32 numpy arrays."""

    #: canonical spec string, accepted by resolve_kernel() to rebuild the same kernel
    spec: str = ""
    #: one-line description for reports and `graphswap kernels`
    description: str = ""

    #: True for kernels whose arithmetic depends on a QuantScheme (8-bit multipliers)
    quantizes: bool = False

    @abc.abstractmethod
    def matmul(self, a: np.ndarray, b: np.ndarray, quant=None) -> np.ndarray:
        """(m,k) x (k,n) -> (m,n) float32."""

    @abc.abstractmethod
    def conv2d(self, x: np.ndarray, w: np.ndarray, geometry: ConvGeometry,
               quant=None) -> np.ndarray:
        """NHWC input x HWIO filter -> NHWC output, float32, geometry fully explicit."""

    def to_config(self) -> dict:
        return {"spec": self.spec}

    @property
    def hardware_metrics(self) -> dict:
        """Hardware figures (e.g. PDK45_PWR) when the kernel's source carries them."""
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"


class SchemeBoundKernel(Kernel):
    """A kernel whose matmul/conv2d always run with one QuantScheme: what a swapped layer hands
    to ops that pass no scheme of their own (graphswap.swap.ops_layers).  Everything else -
    spec, record, library, signedness - is the wrapped kernel's."""

    def __init__(self, kernel: Kernel, quant):
        self.kernel = kernel
        self.quant = quant
        self.spec = kernel.spec
        self.description = kernel.description
        self.quantizes = kernel.quantizes

    def matmul(self, a, b, quant=None):
        return self.kernel.matmul(a, b, quant=self.quant if quant is None else quant)

    def conv2d(self, x, w, geometry, quant=None):
        return self.kernel.conv2d(x, w, geometry, quant=self.quant if quant is None else quant)

    def to_config(self) -> dict:
        return self.kernel.to_config()

    def __getattr__(self, name):
        if name == "kernel":   # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.kernel, name)


def bind_scheme(kernel: Kernel, quant) -> Kernel:
    """`kernel` called with `quant` on every product (the kernel itself when quant is None)."""
    return kernel if quant is None else SchemeBoundKernel(kernel, quant)


def oriented(kernel: Kernel, quant) -> Kernel:
    """`kernel` with its table wired as `quant.operands` and `quant.activation_offset` say
    (LutKernel.wired: the weight on the multiplier's first operand or its second, the activation
    codes moved); every other kernel, or no scheme, as it is."""
    wired = getattr(kernel, "wired", None)
    return kernel if quant is None or wired is None else wired(quant)
