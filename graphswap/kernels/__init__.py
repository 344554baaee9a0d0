"""Kernels: the arithmetic a swapped layer runs, resolved from a spec once.

    spec (what a user types: "mul8u_drum4", "mymul.c")
      -> Kernel (resolve_kernel / open_record; the layer's `arithmetic`)
      -> record (Kernel.to_config(): what a saved model stores)

Modules: base (the Kernel interface), float_kernels (exact, bf16, fp32_m{m}, operation-level
libraries), scheme (QuantScheme: how a multiplier kernel quantizes), quantized (LutKernel: 8-bit
quantization around the table-driven C kernels), derivatives (lut_grad: the tables' own partial
derivatives for the backward pass), specs
(built-in names, specs that name files), trust (the trust sources and the gate every file-named
kernel passes), registry (resolving), check (`graphswap kernels check` in a child process).
"""

from graphswap.kernels import trust
from graphswap.kernels.base import Kernel, SchemeBoundKernel, bind_scheme, oriented
from graphswap.kernels.check import check_kernel, format_result as format_check_result
from graphswap.kernels.derivatives import (DEFAULT_HALF_WIDTH, derivative_tables,
                                           lut_conv2d_gradients, lut_matmul_gradients)
from graphswap.kernels.float_kernels import (FLOAT_KERNELS, LibraryKernel, OperandRoundingKernel,
                                             round_to_bfloat16, truncate_mantissa)
from graphswap.kernels.quantized import (LutKernel, activation_quantization, quantize_asymmetric,
                                         quantize_symmetric, quantize_weights)
from graphswap.kernels.scheme import (ACTIVATION_MODES, GRANULARITIES, OBSERVERS, WEIGHT_ENCODINGS,
                                      QuantScheme, tfapprox_scheme)
from graphswap.kernels.registry import (available_kernels, check, clear_cache, evaluate_anew,
                                        evaluate_passes, lut,
                                        metrics, open_record, operand_levels, plot_error_heatmap,
                                        remember_named_file, require_multiplier, resolve_file_named,
                                        resolve_kernel, resolve_multiplier)
from graphswap.kernels.specs import FileSpec, builtin_names, parse_file_spec
from graphswap.kernels.trust import trust as trust_file, untrust

__all__ = ["SchemeBoundKernel", "bind_scheme", "oriented", "DEFAULT_HALF_WIDTH", "derivative_tables", "lut_conv2d_gradients",
           "lut_matmul_gradients", "ACTIVATION_MODES", "FLOAT_KERNELS", "FileSpec", "GRANULARITIES", "Kernel",
           "LibraryKernel", "LutKernel", "OBSERVERS", "QuantScheme", "WEIGHT_ENCODINGS",
           "activation_quantization", "quantize_weights", "tfapprox_scheme",
           "OperandRoundingKernel", "available_kernels", "builtin_names", "check", "check_kernel",
           "clear_cache", "format_check_result",
           "evaluate_anew", "evaluate_passes", "lut", "metrics", "open_record", "operand_levels", "parse_file_spec",
           "plot_error_heatmap", "quantize_asymmetric", "quantize_symmetric",
           "remember_named_file", "require_multiplier", "resolve_file_named", "resolve_kernel",
           "resolve_multiplier", "round_to_bfloat16", "trust", "trust_file", "truncate_mantissa",
           "untrust"]
