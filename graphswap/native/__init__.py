"""The native layer: compiling C, loading kernel libraries through ctypes (ABI checks, error
codes), the convolution geometry the C ABI receives, and the per-user cache of native code.

Nothing here imports TensorFlow.  Layers above use:
    KernelLibrary, load_library, shipped_library     - call C kernels on numpy buffers
    ConvGeometry, conv_geometry                     - TensorFlow's SAME/VALID as explicit paddings
    im2col, col2im, conv_via_matmul, conv_gradients_via_matmul - convolution lowered to matmuls
    FileContent, read_file, file_sha256             - files read once, with the hash of the bytes
    missing_reason                                  - why a path cannot be opened (link loops too)
    cache_dir, private_copy                         - the owner-only cache
"""

from graphswap.native.cache import cache_dir, owner_only_directory, private_copy, write_atomically
from graphswap.native.files import FileContent, file_sha256, missing_reason, read_file, sha256_of
from graphswap.native.geometry import ConvGeometry, conv_geometry
from graphswap.native.library import (ABI_VERSION, KernelLibrary, load_library, shipped_library,
                                      shipped_library_path)
from graphswap.native.lowering import col2im, conv_gradients_via_matmul, conv_via_matmul, im2col

__all__ = ["ABI_VERSION", "ConvGeometry", "FileContent", "KernelLibrary", "cache_dir", "col2im",
           "conv_geometry", "conv_gradients_via_matmul", "conv_via_matmul", "file_sha256",
           "im2col", "load_library", "missing_reason", "owner_only_directory", "private_copy", "read_file",
           "sha256_of", "shipped_library", "shipped_library_path", "write_atomically"]
