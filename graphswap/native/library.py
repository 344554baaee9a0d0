"""ctypes bridge to kernel libraries that follow native_kernels/include/graphswap_kernels.h.

Responsibilities: load a library (graphswap's own, or a user's .so), check its ABI version and
symbols, declare argument types, call it on numpy buffers (ctypes releases the GIL for the call), and
turn non-zero return codes into KernelExecutionError with the library's own message.  One C call per
layer call covers the whole batch.

Here: loading and the ABI check, the float kernels (GEMM, convolution, the output epilogue) and
the instruction-set control.  The ABI's ctypes mirrors: graphswap.native.abi; the table-driven
calls: graphswap.native.lut_library; graphswap's own library, found or built:
graphswap.native.shipped.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import numpy as np

from graphswap.errors import GraphswapError, KernelExecutionError, KernelLoadError
from graphswap.native.abi import (ABI_VERSION, ERROR_NAMES, F32P, I64, ISA_PATHS, Conv2DParams,
                                  as_input, data_pointer, empty_output, load_quietly)
from graphswap.native.files import file_sha256, open_checked
from graphswap.native.geometry import ConvGeometry
from graphswap.native.lut_library import TableKernels


class KernelLibrary(TableKernels):
    """A loaded kernel library.  Construct through load_library() / shipped_library()."""

    REQUIRED = ("graphswap_abi_version", "graphswap_matmul_f32")

    def __init__(self, path: str | os.PathLike, sha256: str | None = None,
                 load_from: str | None = None):
        """`load_from`: what dlopen opens (the descriptor whose bytes hashed to `sha256`, see
        load_library); `path` names the library in messages."""
        self.path = str(Path(path).resolve())
        if load_from is None and not os.path.isfile(self.path):
            raise KernelLoadError(f"kernel library not found: {self.path}")
        self.sha256 = sha256 or file_sha256(self.path)
        try:
            self._lib = load_quietly(load_from or self.path)
        except OSError as exc:
            reason = str(exc).replace(load_from, self.path) if load_from else exc
            raise KernelLoadError(
                f"cannot load kernel library {self.path}: {reason}. It must be a shared library "
                f"(.so) built for this machine, e.g. 'cc -O3 -shared -fPIC mykernel.c -o libmykernel.so'"
            ) from None
        missing = [name for name in self.REQUIRED if not hasattr(self._lib, name)]
        if missing:
            raise KernelLoadError(
                f"kernel library {self.path} does not export {', '.join(missing)}; an operation-level "
                f"kernel library must export graphswap_abi_version and graphswap_matmul_f32 as "
                f"declared in graphswap_kernels.h (for a scalar multiplier pass 'LIB.so:SYMBOL')")
        self._lib.graphswap_abi_version.restype = ctypes.c_int32
        self._lib.graphswap_abi_version.argtypes = []
        version = self._lib.graphswap_abi_version()
        if version != ABI_VERSION:
            raise KernelLoadError(
                f"kernel library {self.path} was built for graphswap ABI version {version}, but this "
                f"graphswap speaks version {ABI_VERSION}; rebuild it against this graphswap's "
                f"graphswap_kernels.h")
        self._declare()

    def _optional(self, name, restype, argtypes):
        function = getattr(self._lib, name, None)
        if function is not None:
            function.restype = restype
            function.argtypes = argtypes
        return function

    def _declare(self):
        i32 = ctypes.c_int32
        self._matmul = self._optional("graphswap_matmul_f32", i32,
                                      [F32P, F32P, F32P, I64, I64, I64])
        self._conv = self._optional("graphswap_conv2d_f32", i32,
                                    [F32P, F32P, F32P, ctypes.POINTER(Conv2DParams)])
        self._last_error = self._optional("graphswap_last_error", ctypes.c_char_p, [])
        self._set_threads = self._optional("graphswap_set_num_threads", i32, [i32])
        self._isa = self._optional("graphswap_isa", ctypes.c_char_p, [])
        self._isa_supported = self._optional("graphswap_isa_supported", ctypes.c_char_p, [])
        self._set_isa = self._optional("graphswap_set_isa", i32, [ctypes.c_char_p])
        self._blas_info = self._optional("graphswap_blas_info", ctypes.c_char_p, [])
        self._channel_affine = self._optional("graphswap_channel_affine_f32", i32,
                                              [F32P, I64, I64, F32P, F32P, i32])
        self._declare_tables()

    # -- capabilities ------------------------------------------------------------------------
    def function_address(self, name: str) -> int | None:
        """The address of the exported function `name` in this process, or None if the library
        does not export it (for callers that call the library from native code)."""
        function = getattr(self._lib, name, None)
        return None if function is None else ctypes.cast(function, ctypes.c_void_p).value

    @property
    def has_conv2d(self) -> bool:
        return self._conv is not None

    def set_num_threads(self, n: int) -> None:
        if self._set_threads is not None:
            self._set_threads(int(n))

    # -- instruction-set paths (graphswap's own library) ----------------------------------------
    @property
    def isa(self) -> str | None:
        """The code path in use ("scalar", "avx2", "avx512"; "none" while a forced path is
        refused), or None for a library without run-time dispatch."""
        return self._isa().decode() if self._isa is not None else None

    @property
    def supported_isas(self) -> tuple:
        """The code paths this CPU can run."""
        return tuple(self._isa_supported().decode().split()) if self._isa_supported else ()

    def set_isa(self, name: str) -> None:
        """Switch the code path: "scalar", "avx2", "avx512" or "auto" (the best the CPU runs)."""
        if self._set_isa is None:
            raise KernelLoadError(f"{self.path} has no run-time instruction-set dispatch")
        self._check("graphswap_set_isa", self._set_isa(str(name).encode("ascii")))

    @property
    def blas_info(self) -> str | None:
        return self._blas_info().decode() if self._blas_info is not None else None

    def check_isa(self) -> None:
        """Raise KernelLoadError when $GRAPHSWAP_ISA forced a path this CPU cannot run."""
        if self.isa == "none":
            raise KernelLoadError(
                f"GRAPHSWAP_ISA={os.environ.get('GRAPHSWAP_ISA')!r} cannot run here: this CPU runs "
                f"{', '.join(self.supported_isas) or 'scalar'}; unset GRAPHSWAP_ISA or choose one "
                f"of those (allowed: {', '.join(ISA_PATHS)}, auto)")

    # -- calls -------------------------------------------------------------------------------
    def _check(self, function_name: str, code: int) -> None:
        if code == 0:
            return
        message = ""
        if self._last_error is not None:
            raw = self._last_error()
            message = raw.decode("utf-8", "replace") if raw else ""
        raise KernelExecutionError(
            f"kernel {function_name} in {os.path.basename(self.path)} failed with code {code} "
            f"({ERROR_NAMES.get(code, 'unknown code')})" + (f": {message}" if message else ""))

    def matmul_f32_into(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
        """Raw call: (m,k) x (k,n) into the C-contiguous float32 buffer `out` (m,n); returns the
        library's code (0 = ok) without raising.  For checks that watch the buffers themselves
        (`graphswap kernels check`'s guard regions)."""
        m, k = a.shape
        n = b.shape[1]
        return int(self._matmul(data_pointer(a, F32P), data_pointer(b, F32P), data_pointer(out, F32P), m, k, n))

    def conv2d_f32_into(self, x: np.ndarray, w: np.ndarray, out: np.ndarray,
                        geometry: ConvGeometry) -> int:
        """Raw call of graphswap_conv2d_f32 into `out`; returns the library's code."""
        params = Conv2DParams.from_geometry(geometry)
        return int(self._conv(data_pointer(x, F32P), data_pointer(w, F32P), data_pointer(out, F32P),
                              ctypes.byref(params)))

    def matmul_f32(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(m,k) x (k,n) -> (m,n), float32."""
        a = as_input(a, np.float32)
        b = as_input(b, np.float32)
        m, k = a.shape
        k2, n = b.shape
        if k != k2:
            raise GraphswapError(f"matmul shapes do not agree: {a.shape} x {b.shape}; the inner "
                                 f"dimensions must be equal")
        c = empty_output((m, n))
        self._check("graphswap_matmul_f32",
                    self._matmul(data_pointer(a, F32P), data_pointer(b, F32P), data_pointer(c, F32P), m, k, n))
        return c

    def conv2d_f32(self, x: np.ndarray, w: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
        if self._conv is None:
            raise KernelLoadError(f"{self.path} has no graphswap_conv2d_f32")
        x = as_input(x, np.float32)
        w = as_input(w, np.float32)
        out = empty_output(geometry.output_shape)
        params = Conv2DParams.from_geometry(geometry)
        self._check("graphswap_conv2d_f32",
                    self._conv(data_pointer(x, F32P), data_pointer(w, F32P), data_pointer(out, F32P), ctypes.byref(params)))
        return out

    def channel_affine_(self, y: np.ndarray, gain=None, shift=None, relu=False) -> np.ndarray:
        """y * gain + shift over the last axis (None: 1 / 0), then max(y, 0) with `relu`, in one
        pass: in place when y is a writable C-contiguous float32 array, else on a copy; returns
        the result."""
        if not (y.dtype == np.float32 and y.flags.c_contiguous and y.flags.writeable):
            y = np.array(y, dtype=np.float32, order="C")
        channels = y.shape[-1] if y.ndim else 1
        vectors = []
        for name, vector in (("gain", gain), ("shift", shift)):
            if vector is not None:
                vector = as_input(vector, np.float32).reshape(-1)
                if vector.shape[0] != channels:
                    raise GraphswapError(f"{name} has {vector.shape[0]} values for {channels} "
                                         f"output channels; give one per channel")
            vectors.append(vector)
        gain, shift = vectors
        self._check("graphswap_channel_affine_f32",
                    self._channel_affine(data_pointer(y, F32P), y.size // max(channels, 1), channels,
                                         None if gain is None else data_pointer(gain, F32P),
                                         None if shift is None else data_pointer(shift, F32P),
                                         1 if relu else 0))
        return y


_libraries: dict[str, KernelLibrary] = {}
_lock = threading.Lock()


def load_library(path: str | os.PathLike, sha256: str | None = None) -> KernelLibrary:
    """Load (once per resolved path and content hash) an operation-level kernel library.

    The file is opened once (the last component not followed if it is a link: callers pass a real
    file), its bytes are hashed through that descriptor and the library is loaded through the same
    descriptor (/proc/self/fd/N), so what loads is what was hashed.  `sha256`, when given, is the
    hash the caller checked (a private copy made by private_copy(), a cache record): another hash
    is refused (KernelTrustError) and nothing is loaded.
    """
    resolved = str(Path(path).resolve())
    with _lock:
        library = _libraries.get(resolved)
        if library is not None and os.path.isfile(resolved) and \
                (sha256 or file_sha256(resolved)) == library.sha256:
            return library
        if not os.path.isfile(resolved):
            raise KernelLoadError(f"kernel library not found: {resolved}")
        checked = open_checked(resolved, sha256)
        # kept open even when a check after the load fails: the loader knows the loaded object
        # by its /proc/self/fd/N name, which must never name another file in this process
        checked.keep_open()
        library = KernelLibrary(resolved, checked.sha256, load_from=checked.load_path)
        _libraries[resolved] = library
        return library
