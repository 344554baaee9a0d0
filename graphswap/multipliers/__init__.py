"""Multiplier-level kernel specs: scalar 8-bit multipliers turned into 256x256 tables.

Most approximate-computing users hold one scalar multiplier, not a whole GEMM.  graphswap evaluates
it once into a table (graphswap_kernels.h layout: 65536 int32 entries, index (a_code << 8) | b_code,
a = first operand = activation / left matrix, b = second operand = weight / right matrix; a code is
the operand's 8-bit pattern: 0..255 unsigned, the two's-complement byte of -128..127 signed) and the
quantized LUT kernels (graphswap.quantized) run every product through it.

Spec forms (resolved by graphswap.kernels, which checks files and trust first):

  built-in name        mul8u_exact, mul8s_exact, mul8{u,s}_trunc{1..8}, mul8{u,s}_drum{3..6},
                       mul8{u,s}_mitchell (C in native_kernels/src/multipliers.c, cited there).
  PATH.c[:FUNCTION]    a C source with one scalar multiplier (EvoApproxLib style).  The function and
                       its signature are found by parsing the source; FUNCTION picks one when the file
                       has several.  It is compiled with the system C compiler into
                       <cache>/multipliers/, keyed by the source's sha256, together with a generated
                       wrapper that fills the table, so the compiler (not ctypes) does the type
                       conversions.  Signature generations understood:
                         legacy   uint64_t mul8u_X(const uint64_t B, const uint64_t A)  (order B, A)
                         newer    uint16_t f(uint8_t A, uint8_t B) / int16_t mul8s_X(int8_t A, int8_t B)
                         upstream bug: a signed multiplier (name mul8s_*) declared with unsigned types;
                                  handled as signed (operands passed as bit patterns, the 16-bit result
                                  read as two's complement) and reported in `notes`.
                       Operand order: when the parameters are named A and B (any case) the first
                       operand goes to A, whatever their position (this is what makes the legacy
                       (B, A) order right); otherwise positionally.  Signedness: from the parameter
                       types, cross-checked with the mul8s_/mul8u_ name prefix; a contradiction is an
                       error, never a guess.
  LIB.so:SYMBOL[:OPTS] a scalar multiplier exported by a shared library.  Its source is not visible,
                       so the C signature comes from OPTS (comma-separated), by default from the name:
                         u8   uint16_t f(uint8_t a, uint8_t b)         (default for mul8u_*)
                         s8   int16_t  f(int8_t a, int8_t b)           (default for mul8s_*)
                         s8u  uint16_t f(uint8_t a, uint8_t b) computing a signed product on
                              two's-complement bit patterns (EvoApproxLib's mis-declared mul8s files)
                         u64  uint64_t f(uint64_t B, uint64_t A)       (EvoApproxLib legacy)
                         ab / ba  operand order: f(first, second) / f(second, first); default ab,
                              except u64 whose default is ba (its first parameter is B).
                       Return values are read through ctypes with exactly the declared width
                       (c_uint16 / c_int16 / c_uint64): reading a uint16_t return through a wider
                       restype would pick up undefined upper register bits.
                       Every `.c` / `.so` multiplier is evaluated in a child process (a crash is
                       a KernelCrashError naming the signal and the operand row, not a dead
                       program), and its results must be 8x8-bit products at their declared
                       width: 0..65535 unsigned, -32768..32767 signed (or a 16-bit pattern for
                       signed files declared unsigned); anything else is a MultiplierRangeError
                       naming the operands (a uint64_t result of 2**64 - 5 is not -5).
  PATH.lut             graphswap's table file (write_lut() writes it):
                         bytes 0..7   magic b"GSWAPLUT"
                         bytes 8..11  uint32 LE format version, 1
                         bytes 12..15 uint32 LE flags: bit 0 signed; bit 1 (signed only) rows/columns
                                      ordered by value -128..127 instead of by code 0..255
                         then 65536 int32 LE, row-major, row = first operand.  Size must be 262160.
  PATH.bin             TFApprox table: 65536 uint16 LE, row-major (a << 8) | b, unsigned.

8xN multipliers (an 8-bit activation x an N-bit weight, N = 1..7; Multiplier.weight_bits): named
mul8xNu_X / mul8xNs_X (EvoApproxLib's mixed-precision files, `uint64_t f(const uint64_t A /* 8-bit
unsigned operand */, const uint64_t B /* N-bit unsigned operand */)`), recognised by those operand
comments, or declared in the spec: PATH.c:u8x4 / PATH.c:s8x4, LIB.so:SYMBOL:u8x4 (operands as bit
patterns, signature u64 order ab by default), or a version-2 .lut file (table_files).  The N-bit
operand is the weight; the products are read at the circuit's width 8 + N and embedded in the
256x256 layout at the N-bit weight codes (record.py); the weights are quantized to N bits.
Nx8 multipliers (an N-bit activation x an 8-bit weight; Multiplier.activation_bits): named
mul4x8u_X / mul4x8s_X, the N-bit operand comment on the parameter named A, or declared
PATH.c:u4x8 / LIB.so:SYMBOL:u4x8; the products sit at the rows of the N-bit activation codes and
the activations are quantized to N bits (widths.py recognises both forms).  One operand always
has 8 bits.

Anything else (e.g. "exact", "bf16", an operation-level "lib.so") is not a multiplier spec.  Bad
multiplier files raise KernelSpecError saying what was wrong, what is allowed and what to do.

Modules: record (the Multiplier), builtins, csource (C parsing, wrapper, compile cache),
shared_library (.so probing), evaluation (a file's table evaluated in a child process, with range
checks) and table_child (the code that calls the function, run in that child), table_files
(.lut/.bin), loading (the per-process cache), metrics, checks (for `graphswap kernels check`),
plots.  Everything here takes Multiplier objects or
checked file contents (graphswap.native.FileContent); spec strings are resolved by
graphswap.kernels (kernels.lut(spec), kernels.metrics(spec), ...).
"""

from graphswap.multipliers.builtins import DRUM_RANGE, TRUNC_RANGE, builtin_multipliers, looks_like_builtin
from graphswap.multipliers.checks import (check, check_entry, format_check, format_check_lines,
                                          verdict)
from graphswap.multipliers.loading import FILE_KINDS, builtin, clear_cache, evaluate_passes, from_file
from graphswap.multipliers.metrics import (HEADER_KEYS, agrees_with_header, lut, metrics,
                                          operand_levels, parse_header_metrics)
from graphswap.multipliers.plots import plot_error_heatmap
from graphswap.multipliers.record import TABLE_SIZE, Multiplier, operand_values
from graphswap.multipliers.table_files import write_lut

__all__ = ["DRUM_RANGE", "FILE_KINDS", "HEADER_KEYS", "TABLE_SIZE", "TRUNC_RANGE", "Multiplier",
           "agrees_with_header", "builtin", "builtin_multipliers", "check", "check_entry", "clear_cache",
           "evaluate_passes", "format_check", "format_check_lines", "from_file",
           "looks_like_builtin", "lut", "metrics", "operand_levels", "operand_values",
           "parse_header_metrics", "plot_error_heatmap", "verdict", "write_lut"]
