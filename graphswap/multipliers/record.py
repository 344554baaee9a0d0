"""The Multiplier record: a scalar 8-bit multiplier evaluated into its table.

Table layout (graphswap_kernels.h): 65536 int32 entries, index (a_code << 8) | b_code, a = first
operand = activation / left matrix, b = second operand = weight / right matrix; a code is the
operand's 8-bit pattern: 0..255 unsigned, the two's-complement byte of -128..127 signed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from graphswap.errors import KernelSpecError

TABLE_SIZE = 65536


@dataclasses.dataclass(frozen=True, eq=False)
class Multiplier:
    """A scalar 8-bit multiplier evaluated into its table (see the module docstring for the layout)."""

    spec: str                   # canonical spec, accepted by resolve_multiplier()
    name: str                   # function / built-in / file stem
    signed: bool
    table: np.ndarray           # int32[65536], index (a_code << 8) | b_code
    description: str
    kind: str                   # "builtin", "c", "so", "lut", "bin"
    path: str | None = None     # absolute path of the file, if any
    sha256: str | None = None   # of that file
    header_metrics: dict = dataclasses.field(default_factory=dict)       # floats
    header_metrics_text: dict = dataclasses.field(default_factory=dict)  # as printed
    notes: tuple = ()           # how signature / order / signedness were determined

    def to_config(self) -> dict:
        config = {"spec": self.spec}
        if self.path is not None:
            config.update(path=self.path, sha256=self.sha256)
        return config

    def __repr__(self) -> str:
        return f"<Multiplier {self.spec} ({'signed' if self.signed else 'unsigned'})>"



def operand_values(signed: bool) -> np.ndarray:
    """Operand value of each code 0..255."""
    codes = np.arange(256)
    return np.where(codes > 127, codes - 256, codes) if signed else codes


def table_from_products(values: np.ndarray, where: str) -> np.ndarray:
    """The int32 table of evaluated products, refusing products outside the int32 range."""
    if values.min() < -(2 ** 31) or values.max() > 2 ** 31 - 1:
        raise KernelSpecError(f"{where}: products outside the int32 range (min {values.min()}, "
                              f"max {values.max()}); an 8-bit multiplier's products must fit int32")
    return values.astype(np.int32)
