"""The ctypes bridge and the exact C kernels, against numpy and TensorFlow."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import (MATMUL_ONLY_LIBRARY, assert_close_to_roundoff, compile_library,
                      failing_matmul_library, run_python)
from graphswap import native
from graphswap.errors import KernelExecutionError, KernelLoadError, KernelSpecError
from graphswap.native import conv_geometry
from graphswap.kernels import resolve_kernel

RNG = np.random.default_rng(42)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 13), (7, 1, 5), (13, 31, 33), (97, 33, 7),
                                   (64, 64, 64), (256, 400, 120), (3, 500, 257), (129, 17, 130)])
def test_exact_matmul_matches_float64(m, k, n):
    lib = native.shipped_library()
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    c = lib.matmul_f32(a, b)
    assert c.shape == (m, n) and c.dtype == np.float32
    assert_close_to_roundoff(c, a.astype(np.float64) @ b, terms=k,
                             magnitude=np.abs(a.astype(np.float64)) @ np.abs(b))


def test_exact_matmul_accepts_non_contiguous_views():
    lib = native.shipped_library()
    base = RNG.standard_normal((40, 60)).astype(np.float32)
    a = base[::2, ::3]          # strided view (20, 20)
    b = base.T[:20, :9]         # transposed view (20, 9)
    assert not a.flags.c_contiguous and not b.flags.c_contiguous
    assert_close_to_roundoff(lib.matmul_f32(a, b), a.astype(np.float64) @ b, terms=20,
                             magnitude=np.abs(a.astype(np.float64)) @ np.abs(b))


def test_zero_sized_matmul():
    lib = native.shipped_library()
    out = lib.matmul_f32(np.zeros((0, 5), np.float32), np.ones((5, 3), np.float32))
    assert out.shape == (0, 3)
    out = lib.matmul_f32(np.zeros((4, 0), np.float32), np.ones((0, 3), np.float32))
    np.testing.assert_array_equal(out, np.zeros((4, 3)))


CONV_CASES = [
    # (batch, h, w, cin, fh, fw, cout, strides, dilations, padding, groups)
    (1, 5, 5, 1, 3, 3, 1, (1, 1), (1, 1), "valid", 1),
    (3, 9, 7, 2, 3, 2, 5, (2, 1), (1, 1), "same", 1),
    (2, 10, 11, 3, 3, 3, 4, (1, 1), (2, 3), "same", 1),
    (2, 10, 11, 3, 2, 3, 4, (1, 1), (3, 1), "valid", 1),
    (1, 8, 8, 4, 3, 3, 6, (3, 3), (1, 1), "same", 2),
    (5, 7, 9, 6, 1, 1, 9, (1, 1), (1, 1), "valid", 3),
    (2, 6, 6, 6, 3, 3, 6, (2, 2), (1, 1), "same", 6),
    (7, 32, 32, 1, 5, 5, 6, (1, 1), (1, 1), "valid", 1),
    (3, 14, 14, 6, 5, 5, 16, (1, 1), (1, 1), "valid", 1),
    (1, 4, 4, 2, 5, 5, 3, (1, 1), (1, 1), "same", 1),  # filter larger than input
    # the direct AVX-512 path (unit stride, >= 16 input and a multiple of 16 output channels):
    # border pixels and a partial 6-pixel tile; 3 channel vectors; a 64 + 16 channel split; rows
    # of border pixels only; a filter larger than the input
    (2, 13, 11, 16, 3, 3, 32, (1, 1), (1, 1), "same", 1),
    (1, 9, 20, 24, 3, 5, 48, (1, 1), (1, 1), "same", 1),
    (2, 6, 8, 16, 3, 3, 80, (1, 1), (1, 1), "valid", 1),
    (1, 1, 2, 16, 3, 3, 32, (1, 1), (1, 1), "same", 1),
    (1, 3, 4, 16, 5, 5, 32, (1, 1), (1, 1), "same", 1),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[:7])) + f"-{c[7:]}")
def test_exact_conv2d_matches_tensorflow(case):
    batch, h, w, cin, fh, fw, cout, strides, dilations, padding, groups = case
    x = RNG.standard_normal((batch, h, w, cin)).astype(np.float32)
    f = RNG.standard_normal((fh, fw, cin // groups, cout)).astype(np.float32)
    g = conv_geometry(x.shape, f.shape, strides, dilations, padding, groups)
    ours = native.shipped_library().conv2d_f32(x, f, g)
    if groups == 1:
        expected = tf.nn.conv2d(x, f, strides=strides, padding=padding.upper(),
                                dilations=dilations).numpy()
    else:  # TensorFlow's CPU Conv2D has no grouped kernel: reference = per-group convolutions
        cg, og = cin // groups, cout // groups
        expected = np.concatenate([
            tf.nn.conv2d(x[..., i * cg:(i + 1) * cg], f[..., i * og:(i + 1) * og],
                         strides=strides, padding=padding.upper(), dilations=dilations).numpy()
            for i in range(groups)], axis=-1)
    assert ours.shape == expected.shape
    scale = np.abs(x).max() * np.abs(f).max() * fh * fw * cin / groups
    assert np.max(np.abs(ours - expected)) <= 2e-6 * scale


def test_user_library_without_symbols_is_refused(tmp_path):
    lib = compile_library(tmp_path, "nosyms", "int unrelated(void) { return 1; }\n")
    with pytest.raises(KernelLoadError, match="does not export graphswap_abi_version, "
                                              "graphswap_matmul_f32"):
        native.load_library(lib)
    with pytest.raises(KernelLoadError, match="does not export"):
        resolve_kernel(str(lib))


def test_abi_mismatch_is_refused(tmp_path):
    lib = compile_library(tmp_path, "oldabi", """
        #include <stdint.h>
        int32_t graphswap_abi_version(void) { return 0; }
        int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                     int64_t m, int64_t k, int64_t n) { return 0; }
    """)
    with pytest.raises(KernelLoadError, match="ABI version 0.*speaks version 1"):
        native.load_library(lib)


def test_not_a_shared_library(tmp_path):
    fake = tmp_path / "fake.so"
    fake.write_bytes(b"this is not ELF")
    with pytest.raises(KernelLoadError, match="cannot load kernel library"):
        native.load_library(fake)
    with pytest.raises(KernelSpecError, match="not found"):
        resolve_kernel(str(tmp_path / "missing.so"))


def test_error_code_and_message_are_translated(tmp_path):
    lib = failing_matmul_library(tmp_path, "failing", "GRAPHSWAP_ERR_UNSUPPORTED",
                                 "accelerator on fire")
    library = native.load_library(lib)
    with pytest.raises(KernelExecutionError, match=r"code -4 \(unsupported\): accelerator on fire"):
        library.matmul_f32(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))


def test_shipped_kernel_reports_invalid_geometry():
    lib = native.shipped_library()
    x = np.ones((1, 4, 4, 1), np.float32)
    f = np.ones((3, 3, 1, 1), np.float32)
    g = conv_geometry(x.shape, f.shape)
    bad = type(g)(**{**g.__dict__, "out_height": g.out_height + 5})
    with pytest.raises(KernelExecutionError, match="invalid argument"):
        lib.conv2d_f32(x, f, bad)


def test_conv_paths_agree_on_every_isa(each_isa, monkeypatch):
    """The default dispatch (on AVX-512 CPUs the direct convolution for this unit-stride,
    16 x k-channel shape) against the forced im2col + sgemm path, on every ISA path this CPU
    runs: the same sums up to round-off, including the padded border pixels."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3, 15, 29, 32)).astype(np.float32)   # rows the direct path tiles
    k = rng.normal(size=(3, 3, 32, 48)).astype(np.float32)
    geometry = conv_geometry(x.shape, k.shape, (1, 1), (1, 1), "same", 1)
    for isa in each_isa.supported_isas:
        each_isa.set_isa(isa)
        monkeypatch.delenv("GRAPHSWAP_CONV_F32", raising=False)
        default = each_isa.conv2d_f32(x, k, geometry)
        monkeypatch.setenv("GRAPHSWAP_CONV_F32", "blas")
        gemm = each_isa.conv2d_f32(x, k, geometry)
        magnitude = np.abs(default).max()
        assert magnitude > 1.0
        assert_close_to_roundoff(default, gemm, terms=9 * 32)


def test_matmul_only_library_serves_conv_through_lowering(tmp_path):
    lib = compile_library(tmp_path, "matmulonly", MATMUL_ONLY_LIBRARY)
    kernel = resolve_kernel(str(lib))
    assert not kernel.library.has_conv2d
    x = RNG.standard_normal((2, 9, 8, 4)).astype(np.float32)
    f = RNG.standard_normal((3, 3, 2, 6)).astype(np.float32)
    g = conv_geometry(x.shape, f.shape, (2, 1), (1, 1), "same", groups=2)
    expected = native.shipped_library().conv2d_f32(x, f, g)
    magnitude = native.shipped_library().conv2d_f32(np.abs(x), np.abs(f), g)  # sum |x||f|
    assert_close_to_roundoff(kernel.conv2d(x, f, g), expected, terms=3 * 3 * 2,
                             magnitude=magnitude)
    config = kernel.to_config()
    assert config["sha256"] == native.file_sha256(lib) and config["path"] == str(lib.resolve())


ISA_SCRIPT = """
    import sys
    import numpy as np
    import tensorflow as tf
    sys.path.insert(0, "tests")
    import reference
    from conftest import assert_close_to_roundoff
    from graphswap import kernels, native
    from graphswap.native import conv_geometry

    rng = np.random.default_rng(7)
    lib = native.shipped_library()
    import os
    if os.environ.get("GRAPHSWAP_ISA"):
        assert lib.isa == os.environ["GRAPHSWAP_ISA"], (lib.isa, os.environ["GRAPHSWAP_ISA"])
    for m, k, n in [(1, 1, 1), (13, 31, 33), (256, 400, 120), (3, 500, 257)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        assert_close_to_roundoff(lib.matmul_f32(a, b), a.astype(np.float64) @ b, terms=k,
                                 magnitude=np.abs(a.astype(np.float64)) @ np.abs(b))
    for strides, dilations, padding in [((1, 1), (1, 1), "valid"), ((2, 1), (1, 1), "same"),
                                        ((1, 1), (1, 2), "same")]:
        x = rng.standard_normal((3, 11, 9, 4)).astype(np.float32)
        f = rng.standard_normal((3, 3, 4, 6)).astype(np.float32)
        g = conv_geometry(x.shape, f.shape, strides, dilations, padding)
        expected = tf.nn.convolution(x, f, strides=strides, dilations=dilations,
                                     padding=padding.upper()).numpy()
        assert_close_to_roundoff(lib.conv2d_f32(x, f, g), expected, terms=3 * 3 * 4)
    table = kernels.resolve_multiplier("mul8u_drum4").table
    a = rng.normal(size=(37, 70)).astype(np.float32)
    b = rng.normal(size=(70, 19)).astype(np.float32)
    got = kernels.resolve_kernel("mul8u_drum4").matmul(a, b)
    np.testing.assert_array_equal(got, reference.quantized_matmul(a, b, table, signed=False))
    print("ISA-OK")
"""


def test_shipped_kernels_match_references_on_every_isa_path(kernel_isa):
    """graphswap's C kernels against float64/TensorFlow (exact) and the numpy reference (LUT, bit
    for bit), once per instruction-set path the library reports (GRAPHSWAP_ISA), or once on the
    default path while the library has no such switch."""
    env = {"GRAPHSWAP_ISA": kernel_isa} if kernel_isa else {}
    completed = run_python(ISA_SCRIPT, timeout=300, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "ISA-OK" in completed.stdout


def test_the_isa_hook_reads_what_the_library_reports(tmp_path):
    from conftest import library_isas

    reporting = compile_library(tmp_path, "isa", MATMUL_ONLY_LIBRARY + """
    GRAPHSWAP_EXPORT const char *graphswap_isa_supported(void) { return "scalar avx2 avx512"; }
""")
    assert library_isas(reporting) == ["scalar", "avx2", "avx512"]
    assert library_isas(compile_library(tmp_path, "plain", MATMUL_ONLY_LIBRARY)) == []
    # the shipped library reports at least the portable path, and the path in use is one of them
    from graphswap import native

    shipped = library_isas()
    assert "scalar" in shipped and native.shipped_library().isa in shipped


def test_a_forced_isa_the_cpu_cannot_run_is_one_clear_error():
    completed = run_python("""
        import graphswap
        from graphswap import native
        try:
            native.shipped_library()
            print("LOADED")
        except graphswap.KernelLoadError as exc:
            print("REFUSED", exc)
    """, env={"GRAPHSWAP_ISA": "avx1024"})
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "REFUSED GRAPHSWAP_ISA='avx1024' cannot run here" in completed.stdout
    assert "allowed: scalar, avx2, avx512, auto" in completed.stdout
