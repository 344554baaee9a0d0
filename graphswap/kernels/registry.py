"""Resolving kernel specs to Kernel objects: the one place a spec becomes arithmetic.

Two entry points, by who names the kernel (see graphswap.kernels.trust):

    resolve_kernel(spec)            named by the user (API argument, CLI option): a file is read
                                    once, hashed, approved for the session, and loaded from a
                                    private copy of those bytes;
    open_record(record, where)      named by a file (layer config, ONNX node, checkpoint): a
                                    built-in, or a complete record that passes the trust gate
                                    before anything is opened;
    resolve_file_named(spec, dir)   a spec string written in a kernel map: built-in, record, or
                                    a file relative to the map whose content is already trusted.

Kernels are cached per process: built-ins by name, files by kind, path and content hash.
"""

from __future__ import annotations

import os
import threading

from graphswap import multipliers, native
from graphswap.errors import KernelSpecError, KernelTrustError
from graphswap.kernels import trust
from graphswap.kernels.base import Kernel
from graphswap.kernels.fp8 import (BUILTIN_FP8, FP8_FORMS, Fp8Spec, builtin_fp8_kernel,
                                   file_fp8_kernel, parse_fp8_spec)
from graphswap.kernels.float_kernels import (FLOAT_KERNELS, FP32_MANTISSA, FP32_MANTISSA_RANGE,
                                             LibraryKernel, OperandRoundingKernel,
                                             round_to_bfloat16, truncate_mantissa)
from graphswap.kernels.quantized import LutKernel
from graphswap.kernels.specs import FileSpec, builtin_names, parse_file_spec, record_file_spec


def available_kernels() -> dict[str, str]:
    """Every built-in kernel name with a one-line description (family names use {k}-style)."""
    kernels = dict(FLOAT_KERNELS)
    kernels.update(multipliers.builtin_multipliers())
    kernels.update(BUILTIN_FP8)
    return kernels


_cache: dict[tuple, Kernel] = {}
_cache_lock = threading.Lock()

ACCEPTED_FORMS = ("'exact', 'bf16', 'fp32_m{m}', a built-in multiplier (list them with "
                  "'graphswap kernels'), a multiplier file (.c, .lut, .bin), 'lib.so:symbol' for a "
                  "scalar multiplier, an operation-level library (.so), or " + FP8_FORMS)


def _cached(key, build) -> Kernel:
    with _cache_lock:
        kernel = _cache.get(key)
        if kernel is None:
            kernel = build()
            _cache[key] = kernel
        return kernel


def resolve_kernel(spec) -> Kernel:
    """Turn a kernel spec the user names (a string, or a Kernel) into a Kernel; cached.

    A file the user names is read once, hashed, approved for this session (kernel_trust) and
    compiled or loaded from a private copy of those bytes.  A config dict (a kernel record, as a
    saved model stores it) is treated as named by a file: see open_record().  Raises
    KernelSpecError with the list of accepted forms when the spec cannot be resolved.
    """
    if isinstance(spec, Kernel):
        return spec
    if isinstance(spec, dict):
        return open_record(spec, "the kernel record")
    if not isinstance(spec, str) or not spec.strip():
        raise KernelSpecError(f"a kernel spec must be a non-empty string, got {spec!r}; use "
                              f"{ACCEPTED_FORMS}")
    spec = spec.strip()
    fp8_spec = parse_fp8_spec(spec)
    if fp8_spec is not None and fp8_spec.kind is not None:
        path = os.path.abspath(fp8_spec.path)
        if not os.path.isfile(path):
            raise KernelSpecError(f"{fp8_spec.what} not found: {fp8_spec.path} (resolved to "
                                  f"{path}); check the path")
        content = native.read_file(path, fp8_spec.what)
        trust.approve(content)  # the user named it: approved for the session
        return _fp8_file_kernel(fp8_spec.at(path), content)
    file_spec = parse_file_spec(spec)
    if file_spec is None:
        return _builtin_kernel(spec)
    path = os.path.abspath(file_spec.path)
    if not os.path.isfile(path):
        raise KernelSpecError(file_not_found_message(file_spec, path))
    content = native.read_file(path, file_spec.what)
    trust.approve(content)  # the user named it: approved for the session
    return _file_kernel(FileSpec(file_spec.kind, path, file_spec.extra), content)


def file_not_found_message(file_spec: FileSpec, path: str) -> str:
    """The error for a kernel file that cannot be opened: missing, a link loop, a broken link."""
    reason = native.missing_reason(path)
    if reason in ("does not exist", "exists"):  # "exists": a directory, not a file
        return (f"{file_spec.what} not found: {file_spec.path} (resolved to {path}); check the "
                f"path")
    return f"{file_spec.what} {file_spec.path} {reason}; check the path"


def open_record(record, where: str = "the model") -> Kernel:
    """The Kernel a file names (a layer config, an ONNX node, a kernel map, a checkpoint).

    A file never adds trust.  Accepted: a built-in name (as a string or {"spec": name}), or a
    complete record {"spec", "path", "sha256"} whose spec refers to exactly that absolute path;
    the file is checked (trust.admit_recorded_file) before anything opens it.  Anything
    else raises KernelTrustError naming `where`, the file, its hash and how to trust it.
    """
    if isinstance(record, str):
        if record in builtin_names():
            return _builtin_kernel(record)
        raise KernelTrustError(
            f"{where} names the kernel {record!r} without a recorded path and sha256; only "
            f"built-in kernels may be named that way (see 'graphswap kernels'). Re-convert the "
            f"model with 'graphswap convert MODEL --kernel FILE'")
    if not isinstance(record, dict) or not isinstance(record.get("spec"), str):
        raise KernelTrustError(f"{where}: {record!r} is not a kernel record (a built-in name, or "
                               f'{{"spec", "path", "sha256"}}); re-convert the model')
    spec, path, sha256 = record["spec"], record.get("path"), record.get("sha256")
    if path is None and sha256 is None:
        if spec in builtin_names():
            return _builtin_kernel(spec)
        raise KernelTrustError(
            f"{where} names the kernel {spec!r} without a recorded path and sha256; only "
            f"built-in kernels may be named that way (see 'graphswap kernels'). Re-convert the "
            f"model with 'graphswap convert MODEL --kernel FILE'")
    if spec in builtin_names():
        raise KernelTrustError(f"{where}: the built-in kernel {spec!r} is recorded with a file "
                               f"({path!r}); built-ins name no file. Re-convert the model")
    fp8_spec = parse_fp8_spec(spec)
    if fp8_spec is not None and fp8_spec.kind is not None:
        trust.check_record_path(path, where)
        if fp8_spec.path != path:
            raise KernelTrustError(
                f"{where}: the kernel record's spec {spec!r} does not refer to its recorded path "
                f"{path!r}; a record must name one file. Re-convert the model")
        content = trust.admit_recorded_file(path, sha256, fp8_spec.what, where,
                                            executable=fp8_spec.executable)
        return _fp8_file_kernel(fp8_spec, content)
    file_spec = record_file_spec(spec, path, where)
    content = trust.admit_recorded_file(path, sha256, file_spec.what, where,
                                               executable=file_spec.executable)
    return _file_kernel(file_spec, content)


def resolve_file_named(spec, base_dir, where: str) -> Kernel:
    """A kernel spec string written in a file (a kernel map): a built-in, or a file spec whose
    relative path is taken relative to `base_dir` (the map's folder, never the current directory)
    and whose content must already be trusted (native code) - a file never adds trust."""
    if isinstance(spec, dict):
        return open_record(spec, where)
    if not isinstance(spec, str) or not spec.strip():
        raise KernelSpecError(f"{where}: a kernel spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    fp8_spec = parse_fp8_spec(spec)
    if fp8_spec is not None and fp8_spec.kind is not None:
        path, content = _read_named_file(fp8_spec, base_dir, where)
        return _fp8_file_kernel(fp8_spec.at(path), content)
    file_spec = parse_file_spec(spec)
    if file_spec is None:
        return _builtin_kernel(spec)  # a built-in, or the unknown-kernel error
    path, content = _read_named_file(file_spec, base_dir, where)
    return _file_kernel(FileSpec(file_spec.kind, path, file_spec.extra), content)


def _read_named_file(file_spec, base_dir, where) -> tuple[str, native.FileContent]:
    """(path, bytes read once) of the file a kernel map's spec names, relative to the map's
    folder; executable code only if the user trusts those bytes."""
    path = os.path.normpath(os.path.join(os.fspath(base_dir), file_spec.path))
    content = native.read_file(path, file_spec.what) if os.path.isfile(path) else None
    if content is None:
        raise KernelSpecError(f"{where}: {file_spec.what} not found: {file_spec.path} (resolved "
                              f"to {path}, relative to the kernel map's folder)")
    if file_spec.executable:
        trust.require_trusted(content, file_spec.what, where)
    return path, content


def remember_named_file(spec) -> tuple[native.FileContent, bool] | None:
    """For a kernel spec the user names on the command line: record the file it names (its
    current content) in the trust store, so later commands on models that use it need no flag.

    Returns (content, newly recorded), or None for a spec that names no file.  Tables (.lut/.bin)
    are data and are not recorded."""
    fp8_spec = parse_fp8_spec(spec.strip()) if isinstance(spec, str) else None
    if fp8_spec is not None:
        if not fp8_spec.executable:
            return None
        content = native.read_file(os.path.abspath(fp8_spec.path), fp8_spec.what)
        return content, trust.approve(content, persist=True)
    file_spec = parse_file_spec(spec.strip()) if isinstance(spec, str) else None
    if file_spec is None or not file_spec.executable:
        return None
    path = os.path.abspath(file_spec.path)
    content = native.read_file(path, file_spec.what)
    return content, trust.approve(content, persist=True)


def resolve_multiplier(spec) -> multipliers.Multiplier | None:
    """The Multiplier a user-named spec names, or None if it is not a multiplier spec."""
    if isinstance(spec, multipliers.Multiplier):
        return spec
    kernel = spec if isinstance(spec, Kernel) else None
    if kernel is None:
        if isinstance(spec, str):
            file_spec = parse_file_spec(spec.strip())
            name = spec.strip()
            if file_spec is None and not multipliers.looks_like_builtin(name):
                return None
            if file_spec is not None and file_spec.kind == "library":
                return None
        kernel = resolve_kernel(spec)
    return getattr(kernel, "multiplier", None)


def _builtin_kernel(spec: str) -> Kernel:
    if spec in BUILTIN_FP8:
        return _cached((spec,), lambda: builtin_fp8_kernel(spec))
    if spec == "exact":
        return _cached(("exact",), lambda: LibraryKernel(native.shipped_library(), "exact",
                                                         FLOAT_KERNELS["exact"]))
    if spec == "bf16":
        return _cached(("bf16",), lambda: OperandRoundingKernel(
            "bf16", FLOAT_KERNELS["bf16"], round_to_bfloat16))
    match = FP32_MANTISSA.match(spec)
    if match:
        bits = int(match.group(1))
        if bits not in FP32_MANTISSA_RANGE:
            raise KernelSpecError(f"fp32_m{{m}} needs 1 <= m <= 23, got m = {bits}")
        return _cached((spec,), lambda: OperandRoundingKernel(
            spec, f"operand mantissas truncated to {bits} bits, float32 products and sums",
            lambda values: truncate_mantissa(values, bits)))
    if multipliers.looks_like_builtin(spec):
        return _cached((spec,), lambda: LutKernel(multipliers.builtin(spec)))
    raise KernelSpecError(f"unknown kernel {spec!r}; use {ACCEPTED_FORMS}")


def _fp8_file_kernel(fp8_spec: Fp8Spec, content: native.FileContent) -> Kernel:
    """The kernel of a checked FP8 multiplier file (content = the bytes that were checked)."""
    key = ("fp8", fp8_spec.spec, content.sha256)
    return _cached(key, lambda: file_fp8_kernel(fp8_spec, content))


def _file_kernel(file_spec: FileSpec, content: native.FileContent) -> Kernel:
    """Build the kernel of a checked file (content = the bytes that were checked)."""
    key = (file_spec.kind, content.path, content.sha256, file_spec.extra)
    if file_spec.kind == "library":
        def build():
            # what the loader would load with it must be the system's: nothing unpinned runs
            native.check_library_dependencies(content, file_spec.what)
            copy = native.private_copy(content.data, content.sha256,
                                       os.path.basename(content.path))
            library = native.load_library(copy, content.sha256)
            return LibraryKernel(library, content.path,
                                 f"operation-level library {os.path.basename(content.path)}",
                                 path=content.path, sha256=content.sha256)
        return _cached(key, build)
    return _cached(key, lambda: LutKernel(
        multipliers.from_file(file_spec.kind, content, file_spec.extra)))


def clear_cache() -> None:
    """Forget every resolved kernel and evaluated table: the next resolution loads anew."""
    with _cache_lock:
        _cache.clear()
    multipliers.clear_cache()


def evaluate_passes(spec, passes, concurrent=()) -> list[multipliers.Multiplier]:
    """Evaluate the table of a user-named multiplier file (.c, lib.so:symbol) again, bypassing
    every cache: one table per row order in `passes` (one after the other in one process), then
    one per order in `concurrent` (threads at once) - what `kernels check` compares to test
    determinism and re-entrancy (graphswap.multipliers.evaluate_passes)."""
    file_spec = parse_file_spec(spec.strip())
    if file_spec is None or file_spec.kind not in ("c", "so"):
        raise KernelSpecError(f"{spec!r} is not a multiplier in C or in a shared library")
    content = native.read_file(os.path.abspath(file_spec.path), file_spec.what)
    trust.approve(content)
    return multipliers.evaluate_passes(file_spec.kind, content, file_spec.extra, passes,
                                       concurrent)


def evaluate_anew(spec) -> multipliers.Multiplier:
    """The table of a user-named multiplier file evaluated again, bypassing every cache."""
    return evaluate_passes(spec, [range(256)])[0]


def lut(spec):
    """The 256x256 table of a multiplier spec (rows = first operand; see graphswap.multipliers)."""
    return multipliers.lut(require_multiplier(spec))


def metrics(spec) -> dict:
    """Error metrics of a multiplier spec computed from its table (MAE, MAE%, WCE%, EP%, ...)."""
    return multipliers.metrics(require_multiplier(spec))


def operand_levels(spec) -> dict:
    """How many values of each operand a multiplier spec tells apart
    (graphswap.multipliers.operand_levels)."""
    return multipliers.operand_levels(require_multiplier(spec))


def check(spec) -> dict:
    """Sanity checks and metrics of a multiplier spec (graphswap.multipliers.check)."""
    return multipliers.check(require_multiplier(spec))


def plot_error_heatmap(spec, path) -> str:
    """Write the error heat map of a multiplier spec as PNG; returns the path."""
    return multipliers.plot_error_heatmap(require_multiplier(spec), path)


def require_multiplier(spec) -> multipliers.Multiplier:
    """resolve_multiplier(), with a KernelSpecError for a spec that is no multiplier."""
    multiplier = resolve_multiplier(spec)
    if multiplier is None:
        raise KernelSpecError(
            f"{spec!r} is not a multiplier spec; use a built-in multiplier name (e.g. mul8u_drum4; "
            f"see 'graphswap kernels'), a .c file, 'lib.so:symbol', or a .lut/.bin table")
    return multiplier
