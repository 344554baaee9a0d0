"""The GraphswapForward TensorFlow op: a swapped layer's forward pass called from TensorFlow's own
executor thread instead of through tf.numpy_function - for operation-level float32 libraries
(graphswap's "exact", users' .so) and for the fused table-driven kernels of 8-bit multipliers.

tf.numpy_function costs every call a trip through Python (the GIL, array wrapping, our argument
handling): about 100-200 us per swapped layer call on the development VM, which on a small network
is a tenth of the training step.  The op (graphswap/native/tf_op/forward_op.cc) is compiled on first
use against the installed TensorFlow's headers, into the per-user cache (keyed by its source, the
TensorFlow version and the compiler), and loaded with tf.load_op_library - only if its hash
matches the record graphswap wrote when it built it, through the descriptor that was hashed
(graphswap/native/cache.py: a cache is code).  When it cannot be built
(no C++ compiler, headers missing) the swapped layers keep the numpy_function bridge - same results,
slower - and say why once.

GRAPHSWAP_BRIDGE=auto (default) | op (the op or an error) | numpy (always numpy_function) |
xla (the XLA-compilable device path of graphswap/kernels/device_products.py for every kernel it
covers, as inside jit_compile and on accelerators; the rest as "auto").

What a node calls is registered here, in the process (function addresses, geometry, the table and
the resolved quantization scheme), and only the handle goes into the graph: a graph traced in
another process fails with an error naming the cause.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import warnings
from pathlib import Path

import numpy as np
import tensorflow as tf

from graphswap import native
from graphswap.errors import CacheSecurityError, KernelLoadError
from graphswap.kernels.base import SchemeBoundKernel, oriented
from graphswap.kernels.float_kernels import LibraryKernel
from graphswap.kernels.quantized import LutKernel, fused_quant
from graphswap.native import compiler
from graphswap.native.abi import Conv2DParams, LutQuant

SOURCE = Path(__file__).resolve().parent.parent / "native" / "tf_op" / "forward_op.cc"
BRIDGE_MODES = ("auto", "op", "numpy", "xla")
MATMUL, CONV2D, LUT_MATMUL, LUT_CONV2D, CONV2D_BACKPROP_INPUT, LUT_CONV2D_BACKPROP_INPUT = range(6)


class ForwardCall(ctypes.Structure):
    """ctypes mirror of forward_op.cc's ForwardCall (field order is the ABI)."""

    _fields_ = [("kind", ctypes.c_int32), ("has_gain", ctypes.c_int32),
                ("has_shift", ctypes.c_int32), ("relu", ctypes.c_int32),
                ("matmul", ctypes.c_void_p), ("conv2d", ctypes.c_void_p),
                ("last_error", ctypes.c_void_p), ("affine", ctypes.c_void_p),
                ("conv", Conv2DParams), ("library", ctypes.c_char * 256),
                ("table", ctypes.c_void_p), ("quant", LutQuant), ("has_range", ctypes.c_int32),
                ("filter_index", ctypes.c_void_p), ("filter_size", ctypes.c_int64),
                ("kernel_size", ctypes.c_int64), ("range_channels", ctypes.c_int32),
                ("filters", ctypes.c_int32), ("stride_h", ctypes.c_int32),
                ("stride_w", ctypes.c_int32), ("shift_h", ctypes.c_int32),
                ("shift_w", ctypes.c_int32), ("out_height", ctypes.c_int32),
                ("out_width", ctypes.c_int32)]


class _OpLibrary:
    """The loaded op: its TensorFlow module (the op wrapper) and its registry (through ctypes).

    `checked` is the compiled op opened once and hashed (native.open_checked): both loads go
    through that descriptor, which stays open for the process."""

    def __init__(self, checked: native.CheckedFile):
        self.path = Path(checked.path)
        checked.keep_open()  # the loader knows the object by /proc/self/fd/N: never reused
        self.module = tf.load_op_library(checked.load_path)
        self._lib = ctypes.CDLL(checked.load_path)  # the same loaded object: shared registry
        self._lib.graphswap_forward_abi.restype = ctypes.c_int32
        if self._lib.graphswap_forward_abi() != ctypes.sizeof(ForwardCall):
            raise KernelLoadError(f"{self.path} was built with another ForwardCall layout; delete "
                                  f"it so graphswap rebuilds it")
        self._register = self._lib.graphswap_forward_register
        self._register.restype = ctypes.c_int64
        self._register.argtypes = [ctypes.POINTER(ForwardCall)]

    def register(self, call: ForwardCall) -> int:
        return int(self._register(ctypes.byref(call)))


_lock = threading.Lock()
_loaded: _OpLibrary | None = None
_unavailable: str | None = None


def bridge_mode() -> str:
    mode = os.environ.get("GRAPHSWAP_BRIDGE", "auto").strip().lower() or "auto"
    if mode not in BRIDGE_MODES:
        raise _one_line(KernelLoadError(
            f"GRAPHSWAP_BRIDGE={mode!r} is not one of {BRIDGE_MODES}: 'auto' uses the compiled "
            f"op where it can, 'op' insists on it, 'numpy' always uses tf.numpy_function, 'xla' "
            f"the XLA-compilable device path where it covers the kernel; set "
            f"GRAPHSWAP_BRIDGE to {'|'.join(BRIDGE_MODES)} or unset it"))
    return mode


def _one_line(error: Exception) -> Exception:
    """`error`, marked so that TensorFlow's autograph and Keras' layer call re-raise it as it is:
    these errors arise while a model is traced, and autograph would prepend its "in user code:"
    stack and Keras its "Exception encountered when calling ..." to the message (the CLI's one
    `Error:` line became a dozen)."""
    error.ag_pass_through = True
    error._keras_call_info_injected = True
    return error


def _header_dir() -> Path:
    installed = Path(__file__).resolve().parent.parent / "include"
    if (installed / "graphswap_kernels.h").is_file():
        return installed
    source = compiler.native_source_dir()
    if source is None:
        raise compiler.CompilerError("graphswap_kernels.h was not found (neither installed with "
                                     "the package nor in a source checkout)")
    return source / "include"


def _build_flags() -> list[str]:
    return [f"-I{_header_dir()}", *tf.sysconfig.get_compile_flags(),
            *tf.sysconfig.get_link_flags()]


def op_library_target() -> Path:
    """Where the compiled op for this TensorFlow, toolchain and source lives in the cache (keyed
    by their hash); nothing is built or checked here."""
    header_dir = _header_dir()
    toolchain = compiler.compiler_identity(compiler.find_cxx_compiler())
    digest = hashlib.sha256("|".join([*toolchain, tf.__version__, *_build_flags()]).encode())
    digest.update(SOURCE.read_bytes())
    digest.update((header_dir / "graphswap_kernels.h").read_bytes())
    return native.cache_dir() / "tf_op" / f"{digest.hexdigest()[:16]}-graphswap_forward_op.so"


def op_library_path() -> native.CheckedFile:
    """The compiled op for this TensorFlow, opened and hashed: the one graphswap built (its hash
    matches graphswap's record in the cache), else built into the cache now.  A file at its place
    that graphswap did not build - planted, replaced, with or without a hash file beside it - is
    rebuilt, never loaded."""
    target = op_library_target()
    native.owner_only_directory(target.parent)
    checked = native.recorded_artefact(target)
    if checked is None:
        native.remove_stale(target)
        compiler.compile_cxx_shared(SOURCE, target, _build_flags())
        checked = native.record_artefact(target)
    return checked


def op_library() -> _OpLibrary | None:
    """The loaded op, or None when the numpy_function bridge is to be used (GRAPHSWAP_BRIDGE=numpy,
    or the op could not be built - warned once; with GRAPHSWAP_BRIDGE=op that is an error)."""
    global _loaded, _unavailable
    mode = bridge_mode()
    if mode == "numpy":
        return None
    with _lock:
        if _loaded is None and _unavailable is None:
            try:
                _loaded = _OpLibrary(op_library_path())
            except CacheSecurityError as exc:
                raise _one_line(exc)  # an unsafe cache is refused, not worked around
            except (compiler.CompilerError, KernelLoadError, OSError,
                    tf.errors.NotFoundError) as exc:
                _unavailable = str(exc)
                if mode in ("auto", "xla"):
                    warnings.warn(f"graphswap could not build its TensorFlow op, so swapped layers "
                                  f"call their kernels through tf.numpy_function (same results, "
                                  f"slower): {exc}", RuntimeWarning, stacklevel=3)
        if _loaded is None and mode == "op":
            raise _one_line(KernelLoadError(f"GRAPHSWAP_BRIDGE=op, but graphswap's TensorFlow "
                                            f"op is not available: {_unavailable}"))
        return _loaded


def _unbound(arithmetic, quant):
    """(kernel, scheme) of a kernel a layer bound to its scheme (kernels.base.bind_scheme), the
    kernel's table wired as the scheme says (kernels.base.oriented)."""
    if isinstance(arithmetic, SchemeBoundKernel):
        arithmetic, quant = arithmetic.kernel, quant if quant is not None else arithmetic.quant
    return oriented(arithmetic, quant), quant


def supports(arithmetic, kind: str) -> bool:
    """Whether `arithmetic`'s forward `kind` ("matmul" / "conv2d") can run as GraphswapForward:
    operation-level float32 libraries (conv2d where the library exports one) and multiplier
    tables with graphswap's fused kernels (also when bound to a layer's scheme)."""
    arithmetic, _ = _unbound(arithmetic, None)
    if isinstance(arithmetic, LibraryKernel):
        if kind == "conv2d" and not arithmetic.library.has_conv2d:
            return False
    elif not (isinstance(arithmetic, LutKernel) and arithmetic.fused_table is not None):
        return False
    return op_library() is not None


#: the tables registered calls point to, one array per distinct content (kept for the process)
_pinned_tables: dict[bytes, object] = {}


def _pinned(table) -> int:
    key = hashlib.sha256(table.tobytes()).digest()
    return _pinned_tables.setdefault(key, table).ctypes.data


def _call(kind: str, arithmetic, gain, shift, relu: bool, geometry, quant,
          has_range: bool) -> ForwardCall:
    epilogue = gain is not None or shift is not None or relu
    affine = (native.shipped_library().function_address("graphswap_channel_affine_f32")
              if epilogue else None)
    call = ForwardCall(has_gain=int(gain is not None), has_shift=int(shift is not None),
                       relu=int(bool(relu)), affine=affine, has_range=int(has_range))
    if isinstance(arithmetic, LutKernel):
        library = native.shipped_library()
        call.kind = {"matmul": LUT_MATMUL, "conv2d": LUT_CONV2D,
                     "conv2d_backprop_input": LUT_CONV2D_BACKPROP_INPUT}[kind]
        call.matmul = library.function_address("graphswap_lut_matmul_f32")
        call.conv2d = library.function_address("graphswap_lut_conv2d_backprop_input_f32"
                                               if kind == "conv2d_backprop_input"
                                               else "graphswap_lut_conv2d_f32")
        call.table = _pinned(arithmetic.fused_table)
        # a static range arrives per call (the layer's state): its scale is computed in the op
        scheme = quant.with_range(0.0, 1.0) if has_range else quant
        call.quant = fused_quant(arithmetic.resolve_scheme(scheme), arithmetic.signed,
                                 getattr(arithmetic, "weight_bits", 8),
                                 getattr(arithmetic, "activation_bits", 8))
    else:
        library = arithmetic.library
        call.kind = {"matmul": MATMUL, "conv2d": CONV2D,
                     "conv2d_backprop_input": CONV2D_BACKPROP_INPUT}[kind]
        call.matmul = library.function_address("graphswap_matmul_f32")
        call.conv2d = library.function_address("graphswap_conv2d_backprop_input_f32"
                                               if kind == "conv2d_backprop_input"
                                               else "graphswap_conv2d_f32")
    call.last_error = library.function_address("graphswap_last_error")
    call.library = os.path.basename(library.path).encode()[:255]
    if geometry is not None:
        call.conv = Conv2DParams.from_geometry(geometry)
    return call


def _run(kind: str, arithmetic, x, w, gain, shift, relu, geometry=None, quant=None,
         activation_range=None, merged=None):
    arithmetic, quant = _unbound(arithmetic, quant)
    has_range = quant is not None and activation_range is not None
    loaded = op_library()
    call = _call(kind, arithmetic, gain, shift, relu, geometry, quant, has_range)
    if merged is not None:
        merged.fill(call)
    handle = loaded.register(call)
    extras = [t for t in (activation_range if has_range else None, gain, shift) if t is not None]
    return loaded.module.graphswap_forward(x, w, [tf.cast(t, tf.float32) for t in extras],
                                           handle=handle, name="graphswap_forward")


def matmul(arithmetic, a, b, gain=None, shift=None, relu=False, quant=None,
           activation_range=None):
    """relu?((a @ b) * gain + shift) for (m, k) x (k, n) float32 tensors, one op; `quant` and
    `activation_range` as for graphswap.swap.ops.swapped_matmul."""
    return _run("matmul", arithmetic, a, b, gain, shift, relu, None, quant, activation_range)


def conv2d(arithmetic, x, w, geometry, gain=None, shift=None, relu=False, quant=None,
           activation_range=None):
    """relu?(conv(x, w) * gain + shift), NHWC x HWIO float32, `geometry` traced with any batch."""
    return _run("conv2d", arithmetic, x, w, gain, shift, relu, geometry, quant, activation_range)


class MergedTransposed:
    """What GraphswapForward needs to run a Conv2DTranspose's merged sub-pixel phases
    (graphswap/swap/ops_transposed.py) in one call: the merged filter's gather index into the
    Keras kernel's values (then a zero, then the weight-range values), the kernel's size, the
    weight-range channels, and the interleaving of the merged output."""

    def __init__(self, index, kernel_size: int, range_channels: int, filters: int, strides,
                 shifts, output_hw):
        self.index = np.ascontiguousarray(index, np.int32).reshape(-1)
        self.kernel_size, self.range_channels, self.filters = (int(kernel_size),
                                                               int(range_channels), int(filters))
        self.strides, self.shifts = tuple(map(int, strides)), tuple(map(int, shifts))
        self.output_hw = tuple(map(int, output_hw))

    def fill(self, call: ForwardCall) -> None:
        call.filter_index = _pinned(self.index)
        call.filter_size = self.index.size
        call.kernel_size = self.kernel_size
        call.range_channels = self.range_channels
        call.filters = self.filters
        call.stride_h, call.stride_w = self.strides
        call.shift_h, call.shift_w = self.shifts
        call.out_height, call.out_width = self.output_hw


def merged_conv2d_transpose(arithmetic, x, kernel, geometry, merged: MergedTransposed, gain=None,
                            shift=None, relu=False, quant=None, activation_range=None):
    """relu?(Conv2DTranspose(x, kernel) * gain + shift) of an NHWC input and a Keras kernel
    (h, w, filters, in) as ONE merged convolution `geometry` (its input channels include the
    weight-range channels), one op: the filter built, the input extended and the output
    interleaved inside it."""
    return _run("conv2d", arithmetic, x, kernel, gain, shift, relu, geometry, quant,
                activation_range, merged)


def conv2d_backprop_input(arithmetic, x, kernel, forward_geometry, gain=None, shift=None,
                          relu=False, quant=None, activation_range=None):
    """relu?(Conv2DTranspose(x, kernel) * gain + shift) of an NHWC input and a Keras kernel
    (h, w, filters, in) - the input gradient of the convolution `forward_geometry` (traced with
    any batch) - through graphswap's own graphswap_conv2d_backprop_input_f32, one op: the
    products of real values only (one GEMM by every tap, then their scatter-add) - or, for a
    multiplier table, graphswap_lut_conv2d_backprop_input_f32 with the scheme `quant`."""
    return _run("conv2d_backprop_input", arithmetic, x, kernel, gain, shift, relu,
                forward_geometry, quant, activation_range)
