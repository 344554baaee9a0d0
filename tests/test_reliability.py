"""Reliability: bad inputs end in one clear error, nothing half-written; NaN/Inf propagate; kernel
errors stop training with the kernel's message; concurrent kernel calls equal sequential ones;
property-based comparison of swapped layers with TensorFlow."""

import ctypes
import errno
import shutil
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphswap
from conftest import SAMPLE_MODEL, assert_close_to_roundoff, compile_library, reduction_terms
from graphswap import SwappedConv2D, SwappedDense, native
from graphswap import io as gsio
from graphswap.cli import main
from graphswap.errors import ModelLoadError, OutputPathError
from graphswap.kernels import resolve_kernel
from conftest import MATMUL_ONLY_LIBRARY


def test_truncated_keras_file(tmp_path):
    data = SAMPLE_MODEL.read_bytes()
    path = tmp_path / "truncated.keras"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        gsio.load_model(path)
    result = CliRunner().invoke(main, ["convert", str(path)])
    assert result.exit_code == 1 and "corrupt or truncated" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["truncated.keras"]


def test_unwritable_output_directory(tmp_path):
    # /proc refuses new files even for root, unlike a chmod-ed directory
    result = CliRunner().invoke(main, ["convert", str(SAMPLE_MODEL), "-o",
                                       "/proc/graphswap-test.keras"])
    assert result.exit_code == 1
    assert "cannot write in /proc" in result.output or "not writable" in result.output


def test_disk_full_during_save_leaves_nothing_behind(tmp_path, monkeypatch):
    model = keras.models.load_model(SAMPLE_MODEL)
    target = tmp_path / "out.keras"
    target.write_bytes(b"previous version")

    def failing_save(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as handle:  # a partial write, then the disk fills up
            handle.write(b"PK\x03\x04partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(keras.Model, "save", failing_save)
    with pytest.raises(OutputPathError, match="No space left on device"):
        gsio.save_model(model, target, force=True)
    assert target.read_bytes() == b"previous version"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.keras"]


def test_nan_and_inf_propagate_as_in_tensorflow():
    model = keras.models.load_model(SAMPLE_MODEL)
    swapped = graphswap.rewrite_model(model)
    x = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 1)).astype(np.float32)
    x[0, 10, 10, 0] = np.nan
    x[1, 3, 3, 0] = np.inf
    x[2, 5, 5, 0] = -np.inf
    ref = model(x).numpy()
    out = swapped(x).numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert_close_to_roundoff(out[3], ref[3], reduction_terms(model))


def test_sizes_overflowing_int64_are_refused_not_crashing():
    lib = native.shipped_library()
    buffer = (ctypes.c_float * 4)()
    pointer = ctypes.cast(buffer, ctypes.POINTER(ctypes.c_float))
    code = lib._matmul(pointer, pointer, pointer, 1 << 62, 8, 1 << 62)
    assert code in (-1, -3)  # invalid argument or overflow, never a write through the buffers
    assert "overflow" in lib._last_error().decode().lower() or code == -1


FAIL_AFTER_LIBRARY = MATMUL_ONLY_LIBRARY.replace(
    "GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void)",
    """static int calls = 0;
    GRAPHSWAP_EXPORT const char *graphswap_last_error(void) { return "ECC fault in the array"; }
    GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void)""").replace(
    "int64_t m, int64_t k, int64_t n) {",
    "int64_t m, int64_t k, int64_t n) {\n        if (++calls > 6) return GRAPHSWAP_ERR_INTERNAL;", 1)


def test_kernel_error_mid_training_stops_fit_with_its_message(tmp_path):
    library = compile_library(tmp_path, "failafter", FAIL_AFTER_LIBRARY)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    swapped = graphswap.rewrite_model(model, kernel=str(library))
    swapped.compile("sgd", "mse")
    x = np.ones((64, 4), np.float32)
    with pytest.raises(Exception, match="ECC fault in the array") as info:
        swapped.fit(x, np.zeros((64, 2), np.float32), batch_size=4, epochs=1, verbose=0)
    assert "graphswap_matmul_f32" in str(info.value)


def test_concurrent_calls_equal_sequential_ones(tmp_path):
    user = resolve_kernel(str(compile_library(tmp_path, "concurrent", MATMUL_ONLY_LIBRARY)))
    exact = resolve_kernel("exact")
    rng = np.random.default_rng(1)
    jobs = [(rng.standard_normal((int(m), 70)).astype(np.float32),
             rng.standard_normal((70, 33)).astype(np.float32)) for m in rng.integers(1, 200, 24)]
    conv_x = rng.standard_normal((3, 12, 12, 4)).astype(np.float32)
    conv_w = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
    geometry = graphswap.native.conv_geometry(conv_x.shape, conv_w.shape, padding="same")
    for kernel in (exact, user):
        sequential = [kernel.matmul(a, b) for a, b in jobs]
        conv_sequential = kernel.conv2d(conv_x, conv_w, geometry)
        results = [None] * len(jobs)
        conv_results = [None] * len(jobs)

        def work(index):
            a, b = jobs[index]
            results[index] = kernel.matmul(a, b)
            conv_results[index] = kernel.conv2d(conv_x, conv_w, geometry)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for got, expected in zip(results, sequential):
            np.testing.assert_array_equal(got, expected)
        for got in conv_results:
            np.testing.assert_array_equal(got, conv_sequential)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(0, 4), height=st.integers(1, 12), width=st.integers(1, 12),
       in_channels=st.integers(1, 5), filters=st.integers(1, 6), kh=st.integers(1, 4),
       kw=st.integers(1, 4), stride=st.integers(1, 3), dilation=st.integers(1, 3),
       padding=st.sampled_from(["valid", "same"]), seed=st.integers(0, 2**31 - 1))
def test_fuzz_swapped_conv2d_against_tensorflow(batch, height, width, in_channels, filters, kh, kw,
                                               stride, dilation, padding, seed):
    if stride > 1 and dilation > 1:
        dilation = 1  # Keras refuses the combination
    if padding == "valid" and (height < (kh - 1) * dilation + 1 or width < (kw - 1) * dilation + 1):
        padding = "same"
    rng = np.random.default_rng(seed)
    stock = keras.layers.Conv2D(filters, (kh, kw), strides=stride, dilation_rate=dilation,
                                padding=padding)
    stock.build((None, height, width, in_channels))
    swapped = SwappedConv2D(filters, (kh, kw), strides=stride, dilation_rate=dilation,
                            padding=padding)
    swapped.build((None, height, width, in_channels))
    weights = [rng.standard_normal(w.shape).astype(np.float32) for w in stock.get_weights()]
    stock.set_weights(weights)
    swapped.set_weights(weights)
    x = rng.standard_normal((batch, height, width, in_channels)).astype(np.float32)
    got = swapped(x).numpy()
    assert got.shape == tuple(stock.compute_output_shape(x.shape))
    if batch == 0:
        return  # (some oneDNN builds give an empty batch the input's channel count: not compared)
    expected = stock(x).numpy()
    scale = kh * kw * in_channels * np.abs(weights[0]).max() * max(np.abs(x).max(initial=0), 1)
    np.testing.assert_allclose(got, expected, atol=2e-6 * scale, rtol=0)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(0, 9), features=st.integers(1, 300), units=st.integers(1, 70),
       seed=st.integers(0, 2**31 - 1))
def test_fuzz_swapped_dense_against_tensorflow(batch, features, units, seed):
    rng = np.random.default_rng(seed)
    stock = keras.layers.Dense(units)
    stock.build((None, features))
    swapped = SwappedDense(units)
    swapped.build((None, features))
    weights = [rng.standard_normal(w.shape).astype(np.float32) for w in stock.get_weights()]
    stock.set_weights(weights)
    swapped.set_weights(weights)
    x = rng.standard_normal((batch, features)).astype(np.float32)
    scale = features * np.abs(weights[0]).max() * max(np.abs(x).max(initial=0), 1)
    np.testing.assert_allclose(swapped(x).numpy(), stock(x).numpy(), atol=2e-6 * scale, rtol=0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["mul8u_drum4", "mul8s_trunc3", "mul8u_mitchell", "mul8s_exact"]),
       batch=st.integers(1, 3), height=st.integers(1, 9), width=st.integers(1, 9),
       in_channels=st.integers(1, 4), out_channels=st.integers(1, 5), kh=st.integers(1, 3),
       kw=st.integers(1, 3), stride=st.integers(1, 3), dilation=st.integers(1, 2),
       padding=st.sampled_from(["valid", "same"]), seed=st.integers(0, 2**31 - 1))
def test_fuzz_lut_conv2d_against_numpy_reference(name, batch, height, width, in_channels,
                                                 out_channels, kh, kw, stride, dilation, padding,
                                                 seed):
    import reference
    from graphswap.native import conv_geometry
    from graphswap.kernels import resolve_multiplier
    from graphswap.kernels import LutKernel

    if padding == "valid" and (height < (kh - 1) * dilation + 1 or width < (kw - 1) * dilation + 1):
        padding = "same"
    rng = np.random.default_rng(seed)
    x = rng.normal(0.2, 1.0, (batch, height, width, in_channels)).astype(np.float32)
    w = rng.normal(0.0, 0.4, (kh, kw, in_channels, out_channels)).astype(np.float32)
    g = conv_geometry(x.shape, w.shape, (stride, stride), (dilation, dilation), padding)
    multiplier = resolve_multiplier(name)
    got = LutKernel(multiplier).conv2d(x, w, g)
    want = reference.quantized_conv2d(x, w, multiplier.table, multiplier.signed, (stride, stride),
                                      (dilation, dilation),
                                      (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right), 1)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["mul8u_trunc6", "mul8s_drum5", "mul8s_mitchell", "mul8u_exact"]),
       m=st.integers(1, 70), k=st.integers(1, 300), n=st.integers(1, 40),
       seed=st.integers(0, 2**31 - 1))
def test_fuzz_lut_matmul_against_numpy_reference(name, m, k, n, seed):
    import reference
    from graphswap.kernels import resolve_multiplier
    from graphswap.kernels import LutKernel

    rng = np.random.default_rng(seed)
    a = rng.normal(0.3, 1.0, (m, k)).astype(np.float32)
    b = rng.normal(0.0, 0.2, (k, n)).astype(np.float32)
    multiplier = resolve_multiplier(name)
    np.testing.assert_array_equal(LutKernel(multiplier).matmul(a, b),
                                  reference.quantized_matmul(a, b, multiplier.table,
                                                             multiplier.signed))


# --------------------------------------------------------------------------------------------
# hostile inputs: each one clear error, never "unexpected ..."
# --------------------------------------------------------------------------------------------

def test_symbolic_link_loops_are_named_as_such(tmp_path):
    for name in ("loop.keras", "loop.npz", "loop.c", "loop.json"):
        (tmp_path / name).symlink_to(tmp_path / name)  # points to itself
    runner = CliRunner()
    cases = {
        "model": (["convert", str(tmp_path / "loop.keras")], "model file"),
        "output": (["convert", str(SAMPLE_MODEL), "-o", str(tmp_path / "loop.keras"), "--force"],
                   "output"),
        "data": (["evaluate", str(SAMPLE_MODEL), "--data", str(tmp_path / "loop.npz")], "data"),
        "kernel": (["convert", str(SAMPLE_MODEL), "-o", str(tmp_path / "x.keras"), "--kernel",
                    str(tmp_path / "loop.c")], "multiplier source"),
        "kernels check": (["kernels", "check", str(tmp_path / "loop.c")], "multiplier source"),
        "saliency image": (["saliency", str(SAMPLE_MODEL), str(tmp_path / "loop.npz"), "-o",
                            str(tmp_path / "s.png")], "input file"),
    }
    for case, (args, what) in cases.items():
        result = runner.invoke(main, args)
        assert result.exit_code == 1, (case, result.output)
        assert result.output.startswith(f"Error: {what} "), (case, result.output)
        assert "is a symbolic link loop" in result.output, (case, result.output)
        assert "unexpected" not in result.output and "Traceback" not in result.output, case
    assert not (tmp_path / "x.keras").exists()


def test_a_corrupt_image_in_an_image_folder_is_named(tmp_path, digits):
    from PIL import Image

    for label in (0, 1):
        (tmp_path / "images" / f"class{label}").mkdir(parents=True)
        for i in range(3):
            pixels = digits["x_test"][i + 3 * label, :, :, 0].astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "images" / f"class{label}" / f"{i}.png")
    bad = tmp_path / "images" / "class1" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 8)
    runner = CliRunner()
    for args in (["evaluate", str(SAMPLE_MODEL), "--data", str(tmp_path / "images")],
                 ["finetune", str(SAMPLE_MODEL), "--data", str(tmp_path / "images"), "--epochs",
                  "1", "-o", str(tmp_path / "ft.keras")]):
        result = runner.invoke(main, args)
        assert result.exit_code == 1, result.output
        error = [line for line in result.output.splitlines() if line.startswith("Error: ")]
        assert error == [f"Error: 1 image file(s) in {tmp_path / 'images'} cannot be decoded: "
                         f"{bad} (Invalid PNG. Failed to initialize decoder.); remove or replace "
                         f"them"], result.output
    assert not (tmp_path / "ft.keras").exists()


def test_check_batch_is_bounded_before_any_work(tmp_path):
    from graphswap.errors import GraphswapError

    runner = CliRunner()
    for command, low in (("convert", 0), ("export", 1)):
        for value in ("100000", str(low - 1)):
            result = runner.invoke(main, [command, str(SAMPLE_MODEL), "--check-batch", value,
                                          "-o", str(tmp_path / "out.onnx" if command == "export"
                                                    else tmp_path / "out.keras")])
            assert result.exit_code == 1, result.output  # click's usage error: exit 1 too
            assert f"Invalid value for '--check-batch': {value} is not in the range " \
                   f"{low}<=x<=1024" in result.output
    # the API refuses it before loading anything (the model path does not even exist)
    with pytest.raises(GraphswapError, match="the check batch must be a whole number from 0 to "
                                             "1024, got 100000"):
        gsio.convert(tmp_path / "missing.keras", "exact", check_batch=100000)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_output_below_a_file_is_refused(tmp_path):
    (tmp_path / "some_file").write_text("x")
    result = CliRunner().invoke(main, ["convert", str(SAMPLE_MODEL), "-o",
                                       str(tmp_path / "some_file" / "x.keras")])
    assert result.exit_code == 1
    assert f"{tmp_path / 'some_file'} is a file, not a directory" in result.output
    assert (tmp_path / "some_file").read_text() == "x"


def test_finetune_refuses_a_bad_output_before_training(tmp_path):
    result = CliRunner().invoke(main, ["finetune", str(SAMPLE_MODEL), "--data",
                                       str(SAMPLE_MODEL.parent / "digits.npz"), "-o",
                                       str(tmp_path / "x.npz"), "--checkpoint-dir",
                                       str(tmp_path / "ck")])
    assert result.exit_code == 1
    assert "-o/--output" in result.output and "must end in .keras or .h5" in result.output
    assert "epoch" not in result.output.lower()
    assert not (tmp_path / "ck").exists() and not (tmp_path / "x.npz").exists()
    with pytest.raises(OutputPathError, match="must end in .keras or .h5"):
        graphswap.finetune(SAMPLE_MODEL, SAMPLE_MODEL.parent / "digits.npz",
                           output=tmp_path / "x.npz", checkpoint_dir=tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


def _keras_archive_with_config(path, config_bytes: int, declared: int | None = None):
    """A .keras archive (the sample's) whose config.json is `config_bytes` long (padded with
    spaces, so it compresses to almost nothing); `declared` overwrites the size it claims."""
    import struct
    import zipfile

    with zipfile.ZipFile(SAMPLE_MODEL) as source:
        members = {name: source.read(name) for name in source.namelist()}
    config = members["config.json"]
    members["config.json"] = config + b" " * (config_bytes - len(config))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    if declared is not None:  # lie about the uncompressed size in both headers
        data = bytearray(path.read_bytes())
        name = b"config.json"
        local = data.find(b"PK\x03\x04")
        while local != -1:
            if data[local + 30:local + 30 + len(name)] == name:
                struct.pack_into("<I", data, local + 22, declared)
            local = data.find(b"PK\x03\x04", local + 4)
        central = data.find(b"PK\x01\x02")
        while central != -1:
            if data[central + 46:central + 46 + len(name)] == name:
                struct.pack_into("<I", data, central + 24, declared)
            central = data.find(b"PK\x01\x02", central + 4)
        path.write_bytes(bytes(data))
    return path


def test_a_config_that_inflates_to_gigabytes_is_refused_before_keras_reads_it(tmp_path,
                                                                              monkeypatch):
    from graphswap.io import keras3

    def keras_must_not_read(*args, **kwargs):
        raise AssertionError("Keras was asked to load the archive")

    monkeypatch.setattr(keras3, "MAX_ARCHIVE_JSON_BYTES", 8 * 1024 * 1024)  # 8 MiB for the test
    monkeypatch.setattr(keras.models, "load_model", keras_must_not_read)
    big = _keras_archive_with_config(tmp_path / "big.keras", 9 * 1024 * 1024)
    assert big.stat().st_size < 1024 * 1024  # it is small on disk
    with pytest.raises(ModelLoadError, match=r"its config.json declares 9,437,184 bytes, more "
                                             r"than the 8,388,608 bytes graphswap reads"):
        gsio.load_model(big)
    # an archive lying about the size: the decompression itself is bounded (zipfile stops at the
    # declared size, and the CRC then fails)
    liar = _keras_archive_with_config(tmp_path / "liar.keras", 9 * 1024 * 1024, declared=4096)
    with pytest.raises(ModelLoadError, match="is not a valid Keras archive"):
        gsio.load_model(liar)
    result = CliRunner().invoke(main, ["convert", str(big)])
    assert result.exit_code == 1 and "its config.json declares" in result.output
