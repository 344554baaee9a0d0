"""Multiplier tables on disk: graphswap's .lut format (read and write) and TFApprox's .bin.

.lut:  bytes 0..7 magic b"GSWAPLUT"; 8..11 uint32 LE format version 1; 12..15 uint32 LE flags
       (bit 0 signed; bit 1, signed only: rows/columns ordered by value -128..127 instead of by
       code 0..255); then 65536 int32 LE, row-major, row = first operand.  262160 bytes.
       Version 2 (8xN multipliers, an N-bit weight): the same 16 bytes with version 2, then
       uint32 LE N (1..7; 2..7 signed) and uint32 LE 0 (reserved), then 256 x 2^N int32 LE,
       row-major: row = the activation's 8-bit code (as in version 1), column = the weight's N-bit
       code 0..2^N-1 (its N-bit two's-complement pattern when signed; with flag bit 1 the
       columns are ordered by value -2^(N-1)..2^(N-1)-1).  24 + 1024 * 2^N bytes.
.bin:  65536 uint16 LE, row-major (a << 8) | b, unsigned (TFApprox).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from graphswap.errors import KernelSpecError
from graphswap.multipliers.record import (TABLE_SIZE, Multiplier, embed_weight_table,
                                          table_from_products, weight_codes)
from graphswap.native import FileContent

LUT_MAGIC = b"GSWAPLUT"
LUT_VERSION = 1
LUT_HEADER = struct.Struct("<8sII")
LUT_FLAG_SIGNED = 1
LUT_FLAG_VALUE_ORDER = 2
LUT_FILE_SIZE = LUT_HEADER.size + 4 * TABLE_SIZE
LUT_VERSION_NARROW = 2
LUT_NARROW_HEADER = struct.Struct("<II")   # weight bits, reserved


def _narrow_file_size(bits: int) -> int:
    return LUT_HEADER.size + LUT_NARROW_HEADER.size + 4 * 256 * 2 ** bits


def _narrow_value_order(bits: int) -> np.ndarray:
    """N-bit weight codes 0..2^N-1 -> position in the value order -2^(N-1)..2^(N-1)-1."""
    return (np.arange(2 ** bits) + 2 ** (bits - 1)) % 2 ** bits
BIN_FILE_SIZE = 2 * TABLE_SIZE


def _value_order_permutation() -> np.ndarray:
    """codes 0..255 -> position in the value order -128..127."""
    return (np.arange(256) + 128) % 256


def write_lut(path, table, signed: bool, value_order: bool = False,
              table_order: str | None = None, weight_bits: int = 8) -> None:
    """Write a graphswap .lut file.

    weight_bits < 8 (an 8xN multiplier) writes a version-2 file (module docstring): `table` is
    Multiplier.table (65536 entries) or Multiplier.weight_table() (256 x 2^N, code order).

    `table` is either 65536 entries in code order (the Multiplier.table layout) or a 256x256 array.
    A signed 256x256 array is ambiguous - lut() returns rows/columns ordered by value -128..127,
    Multiplier.table.reshape(256, 256) is in code order - so it needs table_order="value" or
    "code"; for unsigned tables the two orders are the same.  With value_order=True (signed only)
    the file stores rows and columns ordered -128..127; the file's flags say which, so either file
    reads back as the same multiplier.
    """
    table = np.asarray(table)
    if weight_bits != 8:
        _write_narrow_lut(path, table, signed, value_order, weight_bits)
        return
    if table.shape == (256, 256) and signed:
        if table_order not in ("code", "value"):
            raise KernelSpecError(
                "a signed 256x256 table is ambiguous: pass table_order='value' for a table from "
                "graphswap.kernels.lut() (rows/columns -128..127) or table_order='code' for "
                "Multiplier.table.reshape(256, 256) (rows/columns by two's-complement code)")
        if table_order == "value":
            perm = _value_order_permutation()  # code -> position in value order
            table = table[np.ix_(perm, perm)]
    elif table.size != TABLE_SIZE:
        raise KernelSpecError(f"a multiplier table has 65536 entries (or 256x256), got shape "
                              f"{table.shape}; pass Multiplier.table or graphswap.kernels.lut()")
    table = table.reshape(256, 256).astype(np.int64)
    if value_order:
        if not signed:
            raise KernelSpecError("value_order applies to signed tables only; pass "
                                  "value_order=False for an unsigned table")
        perm = np.argsort(_value_order_permutation())  # position -> code
        table = table[np.ix_(perm, perm)]
    flags = (LUT_FLAG_SIGNED if signed else 0) | (LUT_FLAG_VALUE_ORDER if value_order else 0)
    data = LUT_HEADER.pack(LUT_MAGIC, LUT_VERSION, flags) + table_from_products(
        table.reshape(-1), str(path)).astype("<i4").tobytes()
    Path(path).write_bytes(data)


def _write_narrow_lut(path, table, signed: bool, value_order: bool, bits: int) -> None:
    if bits not in range(1, 8) or (signed and bits < 2):
        raise KernelSpecError(f"an 8xN table's weight has 1..7 bits (2..7 signed); got "
                              f"weight_bits={bits!r}")
    if table.size == TABLE_SIZE:   # Multiplier.table: the N-bit columns in code order
        table = table.reshape(256, 256)[:, weight_codes(signed, bits)]
    if table.shape != (256, 2 ** bits):
        raise KernelSpecError(f"an 8x{bits} multiplier table has shape (256, {2 ** bits}) or 65536 "
                              f"entries; got shape {table.shape}; pass Multiplier.weight_table() "
                              f"or Multiplier.table")
    table = table.astype(np.int64)
    if value_order:
        if not signed:
            raise KernelSpecError("value_order applies to signed tables only; pass "
                                  "value_order=False for an unsigned table")
        rows = np.argsort(_value_order_permutation())
        cols = np.argsort(_narrow_value_order(bits))
        table = table[np.ix_(rows, cols)]
    flags = (LUT_FLAG_SIGNED if signed else 0) | (LUT_FLAG_VALUE_ORDER if value_order else 0)
    data = (LUT_HEADER.pack(LUT_MAGIC, LUT_VERSION_NARROW, flags) + LUT_NARROW_HEADER.pack(bits, 0)
            + table_from_products(table.reshape(-1), str(path)).astype("<i4").tobytes())
    Path(path).write_bytes(data)


def _from_narrow_lut(content: FileContent, flags: int) -> Multiplier:
    path, data = content.path, content.data
    layout = ("a version-2 .lut file (8xN) is the 16-byte header (b'GSWAPLUT', uint32 version 2, "
              "uint32 flags), uint32 N (the weight's bits, 1..7; 2..7 signed), uint32 0, and "
              "256 x 2^N little-endian int32 entries; write one with "
              "graphswap.multipliers.write_lut(..., weight_bits=N)")
    signed = bool(flags & LUT_FLAG_SIGNED)
    if len(data) < LUT_HEADER.size + LUT_NARROW_HEADER.size:
        raise KernelSpecError(f"{path}: truncated 8xN multiplier table ({len(data)} bytes); {layout}")
    bits, reserved = LUT_NARROW_HEADER.unpack_from(data, LUT_HEADER.size)
    if bits not in range(1, 8) or (signed and bits < 2) or reserved != 0:
        raise KernelSpecError(f"{path}: weight width {bits} (reserved field {reserved}) is not "
                              f"allowed; {layout}")
    if len(data) != _narrow_file_size(bits):
        raise KernelSpecError(f"{path}: wrong size for an 8x{bits} multiplier table: {len(data)} "
                              f"bytes, expected {_narrow_file_size(bits)}; {layout}")
    table = np.frombuffer(data, dtype="<i4", offset=LUT_HEADER.size + LUT_NARROW_HEADER.size) \
        .astype(np.int64).reshape(256, 2 ** bits)
    if flags & LUT_FLAG_VALUE_ORDER:
        if not signed:
            raise KernelSpecError(f"{path}: flag 'value order' is set on an unsigned table; {layout}")
        table = table[np.ix_(_value_order_permutation(), _narrow_value_order(bits))]
    kind = "signed" if signed else "unsigned"
    return Multiplier(spec=path, name=Path(path).stem, signed=signed,
                      table=embed_weight_table(table, signed, bits, path),
                      description=f"{kind} 8x{bits} multiplier table {os.path.basename(path)}",
                      kind="lut", path=path, sha256=content.sha256, weight_bits=bits)


def from_lut_file(content: FileContent) -> Multiplier:
    """A multiplier from the bytes of a graphswap .lut file (see the module docstring)."""
    path, data = content.path, content.data
    if len(data) >= LUT_HEADER.size:
        magic, version, flags = LUT_HEADER.unpack_from(data)
        if magic == LUT_MAGIC and version == LUT_VERSION_NARROW and not flags & ~3:
            return _from_narrow_lut(content, flags)
    layout = (f"a .lut file is the 16-byte header (b'GSWAPLUT', uint32 version 1, uint32 flags) and "
              f"65536 little-endian int32 entries: {LUT_FILE_SIZE} bytes; write one with "
              f"graphswap.multipliers.write_lut()")
    if len(data) != LUT_FILE_SIZE:
        raise KernelSpecError(f"{path}: wrong size for a multiplier table: {len(data)} bytes; {layout}"
                              + ("; this looks like a TFApprox table: rename it to .bin"
                                 if len(data) == BIN_FILE_SIZE else ""))
    magic, version, flags = LUT_HEADER.unpack_from(data)
    if magic != LUT_MAGIC or version != LUT_VERSION or flags & ~3:
        raise KernelSpecError(f"{path}: not a graphswap .lut file (magic {magic!r}, version {version}, "
                              f"flags {flags:#x}); {layout}")
    signed = bool(flags & LUT_FLAG_SIGNED)
    table = np.frombuffer(data, dtype="<i4", offset=LUT_HEADER.size).astype(np.int32).reshape(256, 256)
    if flags & LUT_FLAG_VALUE_ORDER:
        if not signed:
            raise KernelSpecError(f"{path}: flag 'value order' is set on an unsigned table; {layout}")
        perm = _value_order_permutation()  # code -> position
        table = table[np.ix_(perm, perm)]
    kind = "signed" if signed else "unsigned"
    return Multiplier(spec=path, name=Path(path).stem, signed=signed,
                      table=np.ascontiguousarray(table.reshape(-1)),
                      description=f"{kind} multiplier table {os.path.basename(path)}", kind="lut",
                      path=path, sha256=content.sha256)


def from_bin_file(content: FileContent) -> Multiplier:
    """A multiplier from the bytes of a TFApprox .bin table."""
    path, data = content.path, content.data
    if len(data) != BIN_FILE_SIZE:
        raise KernelSpecError(
            f"{path}: wrong size for a TFApprox multiplier table: {len(data)} bytes; a .bin table is "
            f"65536 little-endian uint16 products, row-major (a << 8) | b: {BIN_FILE_SIZE} bytes")
    table = np.frombuffer(data, dtype="<u2").astype(np.int32)
    return Multiplier(spec=path, name=Path(path).stem, signed=False, table=table,
                      description=f"unsigned multiplier table {os.path.basename(path)} (TFApprox .bin)",
                      kind="bin", path=path, sha256=content.sha256)

