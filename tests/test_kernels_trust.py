"""A saved model cannot make graphswap load native code the user has not approved (or that changed)."""

import shutil

import keras
import numpy as np
import pytest

import graphswap
from conftest import compile_library, run_python
from graphswap import io as gsio
from graphswap.kernels import trust as kernel_trust
from graphswap.errors import KernelTrustError
from conftest import MATMUL_ONLY_LIBRARY


@pytest.fixture()
def saved_with_user_library(tmp_path):
    library = compile_library(tmp_path, "usermm", MATMUL_ONLY_LIBRARY)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")])
    swapped = graphswap.rewrite_model(model, kernel=str(library))
    config = swapped.get_layer("d").get_config()["arithmetic"]
    assert config["path"] == str(library.resolve())
    assert config["sha256"] == graphswap.native.file_sha256(library)
    path = tmp_path / "user.keras"
    swapped.save(path)
    return path, library, swapped


def _load_in_fresh_process(model_path, env=None):
    return run_python(f"""
        import keras, graphswap
        from graphswap import io as gsio
        try:
            keras.models.load_model({str(model_path)!r})
            print("LOADED")
        except Exception as exc:  # Keras wraps deserialisation errors in TypeError
            assert "refusing to load the kernel library" in str(exc), exc
            try:
                gsio.load_model({str(model_path)!r})
            except graphswap.KernelTrustError as exc:
                print("REFUSED", exc)
    """, env=env)


def test_untrusted_library_named_by_a_model_is_refused(saved_with_user_library):
    model_path, library, _ = saved_with_user_library
    result = _load_in_fresh_process(model_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "REFUSED" in result.stdout
    assert str(library.resolve()) in result.stdout
    assert graphswap.native.file_sha256(library) in result.stdout
    assert "graphswap.trust(" in result.stdout and "GRAPHSWAP_TRUSTED_KERNELS" in result.stdout


@pytest.mark.parametrize("entry", ["path", "hash"])
def test_trust_by_environment_variable(saved_with_user_library, entry):
    model_path, library, _ = saved_with_user_library
    value = str(library) if entry == "path" else graphswap.native.file_sha256(library)
    result = _load_in_fresh_process(model_path, env={"GRAPHSWAP_TRUSTED_KERNELS": value})
    assert "LOADED" in result.stdout, result.stdout + result.stderr[-2000:]


def test_trusted_then_modified_library_is_refused(saved_with_user_library, digits):
    model_path, library, swapped = saved_with_user_library
    graphswap.trust(library)
    loaded = keras.models.load_model(model_path)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x).numpy(), swapped(x).numpy())
    # swap the library for another build: same path, different content
    other = compile_library(library.parent / "other", "usermm", MATMUL_ONLY_LIBRARY + "\n/* v2 */\n"
                            "int graphswap_extra_symbol(void) { return 2; }\n")
    library.unlink()  # a new file (rewriting the loaded one in place would crash this process)
    shutil.copy(other, library)
    with pytest.raises(Exception, match="has changed since the model was saved"):
        keras.models.load_model(model_path)
    with pytest.raises(KernelTrustError, match="has changed since the model was saved"):
        gsio.load_model(model_path)


def test_missing_library_is_reported(saved_with_user_library):
    model_path, library, _ = saved_with_user_library
    library.unlink()
    with pytest.raises(KernelTrustError, match="is missing"):
        gsio.load_model(model_path)


def test_trusting_a_missing_file():
    with pytest.raises(KernelTrustError, match="no such file"):
        kernel_trust.trust("/nonexistent/lib.so")


def test_cli_trust_kernel_option(saved_with_user_library, tmp_path):
    model_path, library, _ = saved_with_user_library
    result = run_python(f"""
        from click.testing import CliRunner
        from graphswap.cli import main
        runner = CliRunner()
        refused = runner.invoke(main, ["inspect", {str(model_path)!r}])
        print("EXIT1", refused.exit_code, refused.output)
        accepted = runner.invoke(main, ["inspect", {str(model_path)!r},
                                        "--trust-kernel", {str(library)!r}])
        print("EXIT2", accepted.exit_code, accepted.output)
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    first, second = result.stdout.split("EXIT2")
    assert "EXIT1 1" in first and "not trusted" in first and "--trust-kernel" in first
    assert second.startswith(" 0") and "d " in second


def test_tampered_cached_table_is_rebuilt_not_used(tmp_path, monkeypatch):
    """What the cache keeps of a `.c` is its table (no compiled code); a table replaced there is
    recomputed from the source, never used."""
    import os
    import stat

    from graphswap import kernels, multipliers, native

    monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "mul8u_cached.c"
    source.write_text("#include <stdint.h>\n"
                      "uint16_t mul8u_cached(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }\n")
    graphswap.trust(str(source))
    first = kernels.resolve_multiplier(str(source))
    built = list((tmp_path / "cache").rglob("table-*.raw"))
    assert len(built) == 1 and not list((tmp_path / "cache").rglob("*.so"))
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700
    # someone replaces the cached table with one computing something else
    evil = np.full(65536, 7, dtype="<u8").tobytes()
    built[0].unlink()
    built[0].write_bytes(evil)
    kernels.clear_cache()
    second = multipliers.from_file("c", native.read_file(str(source), "kernel file"), (None,))
    np.testing.assert_array_equal(second.table, first.table)  # recomputed from the source
    assert built[0].read_bytes() != evil
