"""The native layer: compiling C, loading kernel libraries through ctypes (ABI checks, error
codes), the convolution geometry the C ABI receives, and the per-user cache of native code.

Nothing here imports TensorFlow.  Layers above use:
    KernelLibrary, load_library, shipped_library     - call C kernels on numpy buffers
    ConvGeometry, conv_geometry                     - TensorFlow's SAME/VALID as explicit paddings
    im2col, col2im, conv_via_matmul, conv_gradients_via_matmul - convolution lowered to matmuls
    einsum_plan, EinsumPlan                         - an EinsumDense equation as one matmul
    transposed_conv, insert_zeros, flipped_filter   - Conv2DTranspose as a stride-1 conv2d
    FileContent, read_file, file_sha256             - files read once, with the hash of the bytes
    missing_reason                                  - why a path cannot be opened (link loops too)
    cache_dir, private_copy                         - the owner-only cache
    record_artefact, recorded_artefact, open_checked - compiled code reused only as it was built,
                                                      loaded through the descriptor it was hashed on
    check_library_dependencies, check_source_reads  - nothing read besides the kernel file itself
                                                      but system libraries and headers
"""

from graphswap.native.dependencies import check_library_dependencies, check_source_reads
from graphswap.native.cache import (cache_dir, configured_cache_root, owner_only_directory,
                                    private_copy, record_artefact, recorded_artefact, remove_stale,
                                    write_atomically)
from graphswap.native.files import (CheckedFile, FileContent, file_sha256, missing_reason,
                                    open_checked, read_file, sha256_of)
from graphswap.native.geometry import ConvGeometry, conv_geometry
from graphswap.native.abi import (ABI_VERSION, ISA_PATHS, LUT_SIGNED, LUT_SIGNED_UNSIGNED_ACTIVATIONS,
                                  LUT_UNSIGNED, QUANT_DYNAMIC, QUANT_PER_CHANNEL, QUANT_PER_TENSOR,
                                  QUANT_STATIC, WEIGHTS_DEFAULT, WEIGHTS_SIGN_MAGNITUDE, LutQuant)
from graphswap.native.library import KernelLibrary, load_library
from graphswap.native.shipped import shipped_library, shipped_library_path
from graphswap.native.einsum import EinsumPlan, einsum_plan
from graphswap.native.lowering import col2im, conv_gradients_via_matmul, conv_via_matmul, im2col
from graphswap.native.transpose import (TransposedConv, flipped_filter, insert_zeros,
                                        remove_zeros, transposed_conv, unflipped_filter)

__all__ = ["ISA_PATHS", "LUT_SIGNED", "LUT_SIGNED_UNSIGNED_ACTIVATIONS", "LUT_UNSIGNED", "LutQuant", "QUANT_DYNAMIC",
           "QUANT_PER_CHANNEL", "QUANT_PER_TENSOR", "QUANT_STATIC", "WEIGHTS_DEFAULT",
           "WEIGHTS_SIGN_MAGNITUDE", "ABI_VERSION", "ConvGeometry", "EinsumPlan", "TransposedConv", "einsum_plan",
           "flipped_filter", "insert_zeros", "remove_zeros", "transposed_conv",
           "unflipped_filter", "FileContent", "KernelLibrary", "cache_dir", "col2im",
           "conv_geometry", "conv_gradients_via_matmul", "conv_via_matmul", "file_sha256",
           "im2col", "load_library", "missing_reason", "owner_only_directory", "private_copy", "read_file",
           "sha256_of", "shipped_library", "shipped_library_path", "write_atomically",
           "CheckedFile", "configured_cache_root", "open_checked", "record_artefact",
           "recorded_artefact", "remove_stale", "check_library_dependencies",
           "check_source_reads"]
