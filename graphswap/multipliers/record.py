"""The Multiplier record: a scalar 8-bit multiplier evaluated into its table.

Table layout (graphswap_kernels.h): 65536 int32 entries, index (a_code << 8) | b_code, a = first
operand = activation / left matrix, b = second operand = weight / right matrix; a code is the
operand's 8-bit pattern: 0..255 unsigned, the two's-complement byte of -128..127 signed.

8xN multipliers (EvoApproxLib's mul8x4u_..., or any multiplier declared `:u8x4`): the weight
(second operand) has N < 8 bits, `weight_bits` = N.  Their 256 x 2^N products sit in the same
65536-entry layout, at the 8-bit codes of the N-bit weight values (0..2^N-1 unsigned; the
two's-complement byte of -2^(N-1)..2^(N-1)-1 signed); the weight quantizer never produces another
code (graphswap/kernels/quantized.py), and the entries of the other codes hold the exact product
(never read by a forward pass; they keep the table's finite differences sensible at the edge of
the N-bit range).  `weight_table()` gives the 256 x 2^N function itself.

Nx8 multipliers (EvoApproxLib-style mul4x8u_..., or declared `:u4x8`): the activation (first
operand) has N < 8 bits, `activation_bits` = N, the weight 8.  The 2^N x 256 products sit in the
same layout at the rows of the N-bit activation codes (the same code rule as for weights); every
other row holds the exact product, never read by a forward pass (the activation quantizer never
produces such a code).  `weight_table()` then gives the (2^N, 256) function.  One operand is
always 8 bits wide: an NxM multiplier with both operands narrower is refused.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from graphswap.errors import KernelSpecError

TABLE_SIZE = 65536
#: widths of the weight operand an 8xN multiplier may have (8 = an 8x8 multiplier)
WEIGHT_BITS = (1, 2, 3, 4, 5, 6, 7, 8)


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
    weight_bits: int = 8        # N of an 8xN multiplier: the weight (second operand) has N bits
    activation_bits: int = 8    # N of an Nx8 multiplier: the activation (first operand) has N bits

    def __post_init__(self):
        for operand, bits in (("weight", self.weight_bits), ("activation", self.activation_bits)):
            if bits not in WEIGHT_BITS or (self.signed and bits < 2):
                raise KernelSpecError(
                    f"{self.spec}: a multiplier's {operand} operand has 1..8 bits (2..8 signed); "
                    f"got {bits!r}")
        if self.weight_bits != 8 and self.activation_bits != 8:
            raise KernelSpecError(
                f"{self.spec}: a {self.activation_bits}x{self.weight_bits} multiplier has no 8-bit "
                f"operand; graphswap runs 8xN (N-bit weight) and Nx8 (N-bit activation) "
                f"multipliers, N = 1..7: declare one of those widths")

    @property
    def width(self) -> str:
        """"8x8", "8x4" for an 8xN multiplier, "4x8" for an Nx8 one (first operand x second
        operand bits)."""
        return f"{self.activation_bits}x{self.weight_bits}"

    def weight_table(self) -> np.ndarray:
        """The products as a (2^Na, 2^Nw) int64 array in code order: rows = the activation's
        Na-bit codes (256 for 8 bits), columns = the weight's Nw-bit codes (0..2^N-1 unsigned; the
        N-bit two's-complement pattern signed, so code c holds the value c - 2^N for
        c >= 2^(N-1)).  (256, 2^N) for an 8xN multiplier, (2^N, 256) for an Nx8 one."""
        rows = weight_codes(self.signed, self.activation_bits)
        columns = weight_codes(self.signed, self.weight_bits)
        return self.table.reshape(256, 256)[np.ix_(rows, columns)].astype(np.int64)

    def to_config(self) -> dict:
        config = {"spec": self.spec}
        if self.path is not None:
            config.update(path=self.path, sha256=self.sha256)
        return config

    def __repr__(self) -> str:
        width = "" if self.width == "8x8" else f", {self.width}"
        return f"<Multiplier {self.spec} ({'signed' if self.signed else 'unsigned'}{width})>"



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


def weight_values(signed: bool, bits: int) -> np.ndarray:
    """Value of each N-bit weight code 0..2^N-1 (two's complement when signed)."""
    codes = np.arange(2 ** bits)
    return np.where(codes >= 2 ** (bits - 1), codes - 2 ** bits, codes) if signed else codes


def weight_codes(signed: bool, bits: int) -> np.ndarray:
    """The 8-bit table code (column of the 256x256 layout) of each N-bit weight code 0..2^N-1."""
    return weight_values(signed, bits) % 256


def embed_weight_table(products: np.ndarray, signed: bool, bits: int, where: str,
                       activation_bits: int = 8) -> np.ndarray:
    """The 65536-entry table of an 8xN multiplier's (256, 2^N) products (columns in N-bit code
    order, weight_table()'s layout), or of an Nx8 one's (2^N, 256) products (`activation_bits` =
    N, rows in N-bit code order): the products at their 8-bit codes, the exact product at every
    other code (see the module docstring)."""
    products = np.asarray(products)
    shape = (2 ** activation_bits, 2 ** bits)
    if products.shape != shape:
        raise KernelSpecError(f"{where}: a {activation_bits}x{bits} multiplier's table has shape "
                              f"{shape} (2^{activation_bits} activation codes x 2^{bits} weight "
                              f"codes); got {products.shape}")
    values = operand_values(signed)
    full = (values[:, None] * values[None, :]).astype(np.int64)
    full[np.ix_(weight_codes(signed, activation_bits), weight_codes(signed, bits))] = products
    return table_from_products(full.reshape(-1), where)

