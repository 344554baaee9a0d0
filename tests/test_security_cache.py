"""Caches are code, and trust is decided on what was opened.

Written from the attacker's side: every planted library carries a constructor that writes a
marker file the moment it is loaded, and the marker must never appear.

* the per-user cache: a compiled op or multiplier planted (or swapped in) under its exact name -
  with a `.sha256` file beside it, the old "protection" - is rebuilt, never loaded: graphswap
  reuses an artefact only if its hash matches the record it wrote when it built it;
* a cache (or a folder in it, or above it) that another user owns or may write, or that is a
  symbolic link, is refused in one line saying how to fix it, and nothing is chmod-ed;
* the trusted-path race: a symbolic link that names the attacker's library while graphswap reads
  it and the trusted library afterwards is refused (the decision compares the descriptor that was
  read with the trusted file, never the path resolved again).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import SAMPLE_DATA, SAMPLE_MODEL, compile_library
from graphswap import kernels, native
from graphswap.cli import main
from graphswap.errors import CacheSecurityError, KernelTrustError
from graphswap.kernels import trust as kernel_trust
from graphswap.swap import forward_op

OTHER_UID = 12345

CANARY = r"""
    #include <stdio.h>
    #include <stdlib.h>
    #include <stdint.h>
    #include "graphswap_kernels.h"
    __attribute__((constructor)) static void graphswap_test_canary(void) {
        const char *path = getenv("GRAPHSWAP_TEST_CANARY");
        FILE *f = fopen(path ? path : "/tmp/graphswap-test-canary", "a");
        if (f) { fputs("attacker code ran\n", f); fclose(f); }
    }
    /* enough of every interface graphswap looks for that, once loaded, it would be used */
    uint16_t mul8u_evil(uint8_t a, uint8_t b) { (void)a; (void)b; return 7; }
    void graphswap_fill_multiplier_row(unsigned a, uint64_t *row) {
        (void)a; for (int b = 0; b < 256; b++) row[b] = 7;
    }
    int32_t graphswap_forward_abi(void) { return 0; }
    GRAPHSWAP_EXPORT int32_t graphswap_abi_version(void) { return GRAPHSWAP_ABI_VERSION; }
    GRAPHSWAP_EXPORT int32_t graphswap_matmul_f32(const float *a, const float *b, float *c,
                                                  int64_t m, int64_t k, int64_t n) {
        for (int64_t i = 0; i < m * n; i++) c[i] = 7; (void)a; (void)b; (void)k;
        return GRAPHSWAP_OK;
    }
"""

HONEST_C = """#include <stdint.h>
uint16_t mul8u_mine(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }
"""

USER_LIBRARY = r"""
    #include <stdint.h>
    uint16_t mul8u_user(uint8_t a, uint8_t b) { return (uint16_t)(a * b); }
"""


def _sha(path) -> str:
    return native.file_sha256(path)


def _exact_table() -> np.ndarray:
    a = np.arange(256)
    return (a[:, None] * a[None, :]).reshape(-1)


def _fsnapshot(path: Path):
    info = os.lstat(path)
    return info.st_uid, stat.S_IMODE(info.st_mode)


@pytest.fixture(scope="module")
def built():
    """The op and the shipped library as graphswap built them (in the test process's own cache,
    with graphswap's records): what a fresh cache is seeded with, so no test compiles them."""
    checked = forward_op.op_library_path()
    checked.close()
    native.shipped_library_path()
    return native.cache_dir(), Path(checked.path)


@pytest.fixture()
def attacker(tmp_path, monkeypatch, built):
    """A fresh private cache seeded with graphswap's own builds, the attacker's canary library,
    and a fake C++ compiler that "builds" the op by copying the honest one (fast)."""
    root, honest_op = built
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    shutil.copytree(root / "shipped", cache / "shipped")
    (cache / "records").mkdir(mode=0o700)
    for record in (root / "records").glob("*.json"):  # graphswap's records of those builds
        if json.loads(record.read_text())["artefact"].startswith(("shipped/", "tf_op/")):
            shutil.copy2(record, cache / "records" / record.name)
    marker = tmp_path / "canary-ran"
    canary = compile_library(tmp_path / "evil", "canary", CANARY)
    fake_cxx = tmp_path / "bin" / "fake-c++"
    fake_cxx.parent.mkdir()
    fake_cxx.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "fake-c++ 1 (copies graphswap's own op)"; exit 0; fi
        while [ $# -gt 0 ]; do
            if [ "$1" = "-o" ]; then cp {honest_op} "$2"; exit 0; fi
            shift
        done
        exit 1
    """))
    fake_cxx.chmod(0o755)
    config = tmp_path / "config"
    env = {"GRAPHSWAP_CACHE_DIR": str(cache), "GRAPHSWAP_TEST_CANARY": str(marker),
           "GRAPHSWAP_CONFIG_DIR": str(config), "CXX": str(fake_cxx),
           "GRAPHSWAP_BRIDGE": "numpy"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GRAPHSWAP_TRUSTED_KERNELS", raising=False)
    kernel_trust.clear_session_trust()

    class Attacker:
        pass

    a = Attacker()
    a.tmp, a.cache, a.marker, a.canary, a.env = tmp_path, cache, marker, canary, env
    a.honest_op = honest_op
    yield a
    assert not marker.exists(), "the attacker's library was loaded"


def _run(a, args=None, code=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    """graphswap's CLI (`args`) or Python `code`, in a fresh process, in the attacker's setting."""
    full = {**os.environ, **a.env, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    full["PYTHONPATH"] = str(Path(graphswap.__file__).resolve().parent.parent)
    command = ([sys.executable, "-m", "graphswap.cli", *args] if args is not None
               else [sys.executable, "-c", textwrap.dedent(code)])
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full,
                          cwd=str(a.tmp))


def _error_lines(result) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines()
            if line.startswith("Error:")]


def _tiny_model(path: Path) -> Path:
    keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="fc")]).save(path)
    return path


def _tiny_lut_model(path: Path, kernel="mul8u_drum4") -> Path:
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="fc")])
    graphswap.rewrite_model(model, kernel=kernel).save(path)
    return path


# --------------------------------------------------------------------------------------------
# planted compiled op
# --------------------------------------------------------------------------------------------

def _plant(target: Path, canary: Path) -> None:
    """The attacker's library under the artefact's exact name, with the `.sha256` file beside it
    that graphswap used to trust."""
    target.parent.mkdir(mode=0o700, exist_ok=True)
    if target.exists():
        target.unlink()
    shutil.copy(canary, target)
    Path(str(target) + ".sha256").write_text(_sha(canary))


@pytest.mark.parametrize("entry, when", [("convert", "planted before graphswap built it"),
                                         ("evaluate", "swapped in after graphswap built it"),
                                         ("graphswap.load_model", "planted before graphswap built it")])
def test_a_planted_compiled_op_is_rebuilt_never_loaded(attacker, entry, when):
    a = attacker
    target = forward_op.op_library_target()   # the name graphswap looks for, in this setting
    if when.startswith("swapped"):
        forward_op.op_library_path().close()  # graphswap builds it (and records its hash)
        assert target.read_bytes() == a.honest_op.read_bytes()
    _plant(target, a.canary)
    op = {"GRAPHSWAP_BRIDGE": "op"}           # the op must be used: no silent fallback
    if entry == "convert":
        out = a.tmp / "out.keras"
        result = _run(a, ["convert", str(_tiny_model(a.tmp / "tiny.keras")), "--kernel",
                          "mul8u_drum4", "-o", str(out)], env=op)
        assert result.returncode == 0, result.stderr[-3000:]
        assert out.is_file()
    elif entry == "evaluate":
        result = _run(a, ["evaluate", str(SAMPLE_MODEL), "--data", str(SAMPLE_DATA),
                          "--kernel", "mul8u_drum4"], env=op)
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        model = _tiny_lut_model(a.tmp / "tiny.keras")
        result = _run(a, code=f"""
            import numpy as np, graphswap
            from graphswap.swap import forward_op
            model = graphswap.load_model({str(model)!r})
            y = model(np.ones((2, 6), np.float32)).numpy()
            assert forward_op.op_library() is not None
            print("RAN", y.shape)
        """, env=op)
        assert result.returncode == 0 and "RAN (2, 4)" in result.stdout, result.stderr[-3000:]
    assert not a.marker.exists()
    # graphswap rebuilt its own op in place of the attacker's and recorded that one
    assert target.read_bytes() == a.honest_op.read_bytes()
    assert native.recorded_artefact(target).sha256 == _sha(a.honest_op)


def test_a_planted_shipped_library_is_rebuilt_never_loaded(attacker, monkeypatch):
    """The shipped library a source checkout builds into the cache: replaced by the attacker's
    (with its `.sha256` file), it is rebuilt (a fake build copying graphswap's own, for speed).
    The source-checkout path is taken whatever the layout this suite runs from (an installed
    graphswap, as in .ci/run, has no native_kernels/ beside it and ships its library)."""
    from graphswap.native import compiler, shipped as library

    a = attacker
    honest = native.shipped_library_path()          # this process's, as graphswap built it
    builds = []

    def fake_build(native_dir, output, portable=None):
        builds.append(output)
        shutil.copy(honest, output)
        return output

    repository = Path(__file__).resolve().parent.parent
    monkeypatch.setattr(compiler, "native_source_dir", lambda start=None:
                        repository / "native_kernels")
    # no installed library has this name: the lookup builds into the (attacker's) cache
    monkeypatch.setattr(compiler, "LIBRARY_NAME", "libgraphswap_kernels_checkout.so")
    monkeypatch.setattr(compiler, "build_shipped_library", fake_build)
    monkeypatch.setattr(library, "_shipped", None)
    target = native.shipped_library_path()          # graphswap's build, recorded
    assert target.parent == a.cache / "shipped" and builds == [target]
    _plant(target, a.canary)
    monkeypatch.setattr(library, "_shipped", None)  # found anew: the planted file is there
    assert native.shipped_library_path() == target
    assert builds == [target, target] and target.read_bytes() == honest.read_bytes()
    assert native.recorded_artefact(target).sha256 == _sha(honest)
    assert not a.marker.exists()


# --------------------------------------------------------------------------------------------
# planted compiled multiplier (with a matching .sha256 file)
# --------------------------------------------------------------------------------------------

@pytest.fixture()
def honest_c(attacker):
    source = attacker.tmp / "user" / "mymul.c"
    source.parent.mkdir()
    source.write_text(HONEST_C)
    return source


def _resolved_table(source) -> np.ndarray:
    """The table graphswap resolves for `source` (from its cache when it holds it)."""
    from graphswap import multipliers

    multipliers.clear_cache()
    content = native.read_file(str(source), "kernel file")
    kernel_trust.approve(content)
    return multipliers.from_file("c", content, (None,)).table.reshape(-1)


def _built_multiplier(a, source) -> Path:
    """The cached table of `source` (a C source is compiled and run in the sandbox; what the
    cache keeps is its table, and no compiled code at all)."""
    np.testing.assert_array_equal(_resolved_table(source), _exact_table())
    assert not list((a.cache / "multipliers").rglob("*.so"))
    built = list((a.cache / "multipliers").rglob("table-*.raw"))
    assert len(built) == 1
    return built[0]


def _forget_records(a) -> None:
    """As if the attacker's file had been there before graphswap ever built this multiplier:
    graphswap's records of its compiled multipliers removed (those of the shipped library kept)."""
    forgotten = 0
    for record in (a.cache / "records").glob("*.json"):
        if json.loads(record.read_text())["artefact"].startswith("multipliers/"):
            record.unlink()
            forgotten += 1
    assert forgotten == 1


def _plant_table(table: Path) -> None:
    """The attacker's table (every product 7) under the cached table's name, with a .sha256
    file beside it."""
    planted = np.full(65536, 7, dtype="<u8").tobytes()
    table.unlink()
    table.write_bytes(planted)
    table.with_name(table.name + ".sha256").write_text(native.sha256_of(planted))


@pytest.mark.parametrize("when", ["swapped in after graphswap built it",
                                  "planted before graphswap built it"])
def test_a_planted_multiplier_with_its_sha256_file_is_rebuilt(attacker, honest_c, when):
    a = attacker
    table = _built_multiplier(a, honest_c)
    _plant_table(table)
    if when.startswith("planted"):
        _forget_records(a)
    np.testing.assert_array_equal(_resolved_table(honest_c), _exact_table())  # not the 7s
    assert native.recorded_artefact(table).sha256 == _sha(table)
    assert np.array_equal(np.frombuffer(table.read_bytes(), "<u8"), _exact_table())


@pytest.mark.parametrize("entry", ["convert", "graphswap.load_model"])
def test_a_planted_multiplier_never_loads_in_a_fresh_process(attacker, honest_c, entry):
    a = attacker
    model = a.tmp / "tiny-c.keras"
    if entry == "graphswap.load_model":
        _tiny_lut_model(model, kernel=str(honest_c))
    table = _built_multiplier(a, honest_c)
    _plant_table(table)
    _forget_records(a)
    # and the attacker's library beside it, under the name a compiled multiplier once had
    shutil.copy(a.canary, table.parent / "mul8u_mine-0000000000000000.so")
    if entry == "convert":
        out = a.tmp / "out.keras"
        result = _run(a, ["convert", str(_tiny_model(a.tmp / "tiny.keras")), "--kernel",
                          str(honest_c), "-o", str(out)])
        assert result.returncode == 0 and out.is_file(), result.stderr[-3000:]
    else:
        result = _run(a, code=f"""
            import numpy as np, graphswap
            model = graphswap.load_model({str(model)!r})
            fc = model.get_layer("fc")
            x = np.random.default_rng(0).uniform(-1, 1, (3, 6)).astype(np.float32)
            print("MAX", float(np.abs(model(x).numpy() - x @ fc.kernel.numpy()
                                     - fc.bias.numpy()).max()))
        """, env={"GRAPHSWAP_TRUSTED_KERNELS": _sha(honest_c)})
        assert result.returncode == 0, result.stderr[-3000:]
        # the exact product up to 8-bit quantization, not the planted constant 7s
        assert float(result.stdout.split("MAX")[1]) < 0.1
    assert not a.marker.exists()
    assert np.array_equal(np.frombuffer(table.read_bytes(), "<u8"), _exact_table())


# --------------------------------------------------------------------------------------------
# a cache that is not the user's alone
# --------------------------------------------------------------------------------------------

def _in_cache(*parts):
    def setup(a):
        path = a.cache.joinpath(*parts)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path
    return setup


def _chown(setup, uid=OTHER_UID):
    def apply(a):
        path = setup(a)
        os.chown(path, uid, -1)
        return path
    return apply


def _chmod(setup, mode):
    def apply(a):
        path = setup(a)
        os.chmod(path, mode)
        return path
    return apply


def _as_link(*parts):
    def apply(a):
        path = a.cache.joinpath(*parts)
        real = a.tmp / ("real-" + "-".join(parts or ("cache",)))
        if path.exists():
            path.rename(real)
        else:
            real.mkdir(mode=0o700)
        path.symlink_to(real)
        return path
    return apply


def _parent(mode=None, uid=None):
    def apply(a):
        parent = a.tmp / "shared"
        parent.mkdir(mode=0o755)
        moved = parent / "cache"
        a.cache.rename(moved)
        a.cache = moved
        os.environ["GRAPHSWAP_CACHE_DIR"] = str(moved)
        if mode is not None:
            os.chmod(parent, mode)
        if uid is not None:
            os.chown(parent, uid, -1)
        return parent
    return apply


def _through_foreign_link(a):
    real = a.tmp / "real-parent"
    real.mkdir(mode=0o755)
    a.cache.rename(real / "cache")
    link = a.tmp / "linked-parent"
    link.symlink_to(real)
    os.lchown(link, OTHER_UID, -1)
    a.cache = link / "cache"
    os.environ["GRAPHSWAP_CACHE_DIR"] = str(a.cache)
    return link


#: case -> (setup returning the offending path, words the message must hold)
UNSAFE = {
    "cache owned by another user": (_chown(_in_cache()), "belongs to another user (uid 12345"),
    "cache world-writable (0777)": (_chmod(_in_cache(), 0o777), "writable by group and others"),
    "cache group-writable (0770)": (_chmod(_in_cache(), 0o770), "writable by group"),
    "cache world-writable and sticky (1777)": (_chmod(_in_cache(), 0o1777), "writable by"),
    "tf_op/ owned by another user": (_chown(_in_cache("tf_op")), "belongs to another user"),
    "multipliers/ world-writable": (_chmod(_in_cache("multipliers"), 0o777), "writable by"),
    "records/ owned by another user": (_chown(_in_cache("records")), "belongs to another user"),
    "shipped/ world-writable": (_chmod(_in_cache("shipped"), 0o757), "writable by others"),
    "the cache is a symbolic link": (_as_link(), "is a symbolic link"),
    "multipliers/ is a symbolic link": (_as_link("multipliers"), "is a symbolic link"),
    "tf_op/ is a symbolic link": (_as_link("tf_op"), "is a symbolic link"),
    "parent folder world-writable, not sticky": (_parent(mode=0o777), "writable by others"),
    "parent folder owned by another user": (_parent(uid=OTHER_UID), "belongs to another user"),
    "parent reached through another user's link": (_through_foreign_link,
                                                   "symbolic link"),
}


def _every_cache_use(a, source):
    """What reads the cache: the multiplier compiler, the op, the records, the private copies."""
    yield lambda: native.cache_dir()
    yield lambda: kernels.evaluate_anew(str(source))
    yield lambda: forward_op.op_library_path()
    yield lambda: native.private_copy(a.canary.read_bytes(), _sha(a.canary), "lib.so")
    yield lambda: native.owner_only_directory(native.cache_dir() / "shipped")
    yield lambda: native.owner_only_directory(native.cache_dir() / "records")


@pytest.mark.parametrize("case", list(UNSAFE))
def test_a_cache_that_is_not_the_users_alone_is_refused(attacker, honest_c, case, monkeypatch):
    a = attacker
    monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(a.cache))  # (restored after the test)
    setup, words = UNSAFE[case]
    # the attacker's library waits where graphswap would load from
    _plant(a.cache / "tf_op" / "planted-graphswap_forward_op.so", a.canary)
    offending = setup(a)
    before = _fsnapshot(offending)
    refusals = []
    for use in _every_cache_use(a, honest_c):
        try:
            use()
        except CacheSecurityError as exc:
            refusals.append(str(exc))
    assert refusals, "nothing refused the cache"
    message = refusals[0]
    assert "\n" not in message and words in message, message
    assert "GRAPHSWAP_CACHE_DIR" in message
    assert "chmod" in message or "rm " in message or "Use a" in message or "Replace" in message
    if case.startswith(("cache", "parent", "the cache")):
        assert len(refusals) == 6  # every use of the cache is refused, not only the first
    assert _fsnapshot(offending) == before  # nothing was chmod-ed or chown-ed behind the user


def test_xdg_cache_home_on_a_shared_disk_is_refused(attacker, honest_c, monkeypatch):
    """No GRAPHSWAP_CACHE_DIR: $XDG_CACHE_HOME/graphswap, where another user made it first on a
    shared, world-writable disk and planted a multiplier."""
    a = attacker
    shared = a.tmp / "shared-disk"
    shared.mkdir()
    os.chmod(shared, 0o777)
    planted = shared / "graphswap" / "multipliers"
    planted.mkdir(parents=True)
    shutil.copy(a.canary, planted / "mul8u_mine-0000000000000000.so")
    for folder in (shared / "graphswap", planted):
        os.chown(folder, OTHER_UID, -1)
        os.chmod(folder, 0o777)
    monkeypatch.delenv("GRAPHSWAP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    with pytest.raises(CacheSecurityError) as refused:
        kernels.evaluate_anew(str(honest_c))
    message = str(refused.value)
    assert "\n" not in message and str(shared) in message and "GRAPHSWAP_CACHE_DIR" in message
    assert "writable by others" in message  # the shared disk itself, first on the way
    assert _fsnapshot(shared / "graphswap") == (OTHER_UID, 0o777)


def test_an_unsafe_cache_is_one_error_line_from_the_cli_and_nothing_loads(attacker, honest_c):
    a = attacker
    _plant(forward_op.op_library_target(), a.canary)
    model = _tiny_model(a.tmp / "tiny.keras")
    os.chmod(a.cache, 0o777)
    out = a.tmp / "out.keras"
    result = _run(a, ["convert", str(model), "--kernel", str(honest_c), "-o", str(out)],
                  env={"GRAPHSWAP_BRIDGE": "auto"})
    assert result.returncode == 1
    lines = _error_lines(result)
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "is writable by group and others (permissions 0777)" in lines[0]
    assert f"chmod 700 {a.cache}" in lines[0] and "GRAPHSWAP_CACHE_DIR" in lines[0]
    assert not out.exists()
    assert stat.S_IMODE(os.stat(a.cache).st_mode) == 0o777


def test_an_unsafe_cache_is_refused_by_load_model_in_a_fresh_process(attacker):
    a = attacker
    model = _tiny_lut_model(a.tmp / "tiny.keras")
    _plant(forward_op.op_library_target(), a.canary)
    os.chown(a.cache, OTHER_UID, -1)
    result = _run(a, code=f"""
        import numpy as np, graphswap
        from graphswap.errors import CacheSecurityError
        try:
            graphswap.load_model({str(model)!r})(np.ones((2, 6), np.float32))
            print("LOADED")
        except CacheSecurityError as exc:
            print("REFUSED", exc)
    """, env={"GRAPHSWAP_BRIDGE": "auto"})
    assert "REFUSED" in result.stdout and "LOADED" not in result.stdout, result.stderr[-3000:]
    assert "belongs to another user (uid 12345" in result.stdout


def test_a_private_cache_in_tmp_is_used(attacker, honest_c, monkeypatch):
    """What CI does: GRAPHSWAP_CACHE_DIR=$(mktemp -d), in root's sticky /tmp."""
    import tempfile

    cache = Path(tempfile.mkdtemp())
    try:
        monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(cache))
        assert native.cache_dir() == cache
        np.testing.assert_array_equal(kernels.evaluate_anew(str(honest_c)).table.reshape(-1),
                                      _exact_table())
        for folder in [cache, *(p for p in cache.rglob("*") if p.is_dir())]:
            assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
        # a missing cache (and missing folders above it) is created owner-only
        nested = cache / "a" / "b" / "cache"
        monkeypatch.setenv("GRAPHSWAP_CACHE_DIR", str(nested))
        assert native.cache_dir() == nested and stat.S_IMODE(os.stat(nested).st_mode) == 0o700
    finally:
        shutil.rmtree(cache)


# --------------------------------------------------------------------------------------------
# the trusted-path race (open once, check what was opened)
# --------------------------------------------------------------------------------------------

def _record_model(a, path: Path, library: Path, sha256: str, symbol="mul8u_evil") -> Path:
    """A model whose layer 'fc' records `library` (a link, for the race) with `sha256`."""
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="fc")])
    plain = a.tmp / "plain.keras"
    graphswap.rewrite_model(model, kernel="mul8u_drum4").save(plain)
    record = {"spec": f"{library}:{symbol}:u8", "path": str(library), "sha256": sha256}
    with zipfile.ZipFile(plain) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(members["config.json"])
    for layer in config["config"]["layers"]:
        if layer["config"].get("name") == "fc":
            layer["config"].pop("swap_kernel", None)
            layer["config"]["arithmetic"] = record
    members["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.fixture()
def race(attacker, monkeypatch):
    """The user trusts their library by path ($GRAPHSWAP_TRUSTED_KERNELS); the attacker's model
    records a symbolic link, with the hash of the attacker's library, that points at the attacker's
    library while graphswap reads it and at the trusted library right after."""
    a = attacker
    user_lib = compile_library(a.tmp / "userlib", "user", USER_LIBRARY)
    link = a.tmp / "evil" / "innocent.so"
    link.symlink_to(a.canary)
    model = _record_model(a, a.tmp / "race.keras", link, _sha(a.canary))
    a.env["GRAPHSWAP_TRUSTED_KERNELS"] = str(user_lib)
    monkeypatch.setenv("GRAPHSWAP_TRUSTED_KERNELS", str(user_lib))
    a.user_lib, a.link, a.model = user_lib, link, model
    return a


def _flip_after_read(monkeypatch, link: Path, to: Path):
    """The hook between graphswap's read and its trust decision: re-point the link."""
    real_read = kernel_trust.read_file

    def read_then_flip(path, what):
        content = real_read(path, what)
        if os.path.abspath(path) == str(link):
            link.unlink()
            link.symlink_to(to)
        return content

    monkeypatch.setattr(kernel_trust, "read_file", read_then_flip)


@pytest.mark.parametrize("entry", ["graphswap.load_model", "keras.models.load_model"])
def test_the_symlink_race_is_refused_through_the_api(race, monkeypatch, entry):
    a = race
    _flip_after_read(monkeypatch, a.link, a.user_lib)
    load = graphswap.load_model if entry.startswith("graphswap") else keras.models.load_model
    with pytest.raises(KernelTrustError) as refused:
        load(a.model)
    message = str(refused.value)
    assert "layer 'fc'" in message.splitlines()[0] and "is not trusted" in message
    assert _sha(a.canary) in message
    assert os.readlink(a.link) == str(a.user_lib)  # the race did happen: the link was flipped


def test_the_symlink_race_is_refused_by_inspect_in_a_fresh_process(race):
    a = race
    result = _run(a, code=f"""
        import os, sys
        from pathlib import Path
        from graphswap.kernels import trust
        link, to = Path({str(a.link)!r}), Path({str(a.user_lib)!r})
        real_read = trust.read_file
        def read_then_flip(path, what):
            content = real_read(path, what)
            if os.path.abspath(path) == str(link):
                link.unlink(); link.symlink_to(to)
            return content
        trust.read_file = read_then_flip
        from graphswap.cli import main
        sys.argv = ["graphswap", "inspect", {str(a.model)!r}]
        main()
    """)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    lines = _error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("Error: layer 'fc'"), result.stderr[-3000:]
    assert "is not trusted" in lines[0] and "Traceback" not in result.stderr
    assert os.readlink(a.link) == str(a.user_lib)


def test_trust_by_path_still_admits_the_file_it_names(race):
    """The other side: the trusted file, named directly or through a link that stays put, loads
    (the descriptor read is the trusted path's file)."""
    a = race
    os.unlink(a.link)
    a.link.symlink_to(a.user_lib)
    for recorded in (a.user_lib, a.link):
        model = _record_model(a, a.tmp / f"ok-{recorded.name}.keras", recorded, _sha(a.user_lib),
                              symbol="mul8u_user")
        model = graphswap.load_model(model)
        x = np.random.default_rng(1).uniform(-1, 1, (2, 6)).astype(np.float32)
        assert model(x).shape == (2, 4)


def test_read_file_reports_the_identity_of_what_it_read(tmp_path):
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    first.write_bytes(b"first")
    second.write_bytes(b"second")
    link = tmp_path / "link"
    link.symlink_to(first)
    content = native.read_file(str(link), "file")
    info = os.stat(first)
    assert content.identity == (info.st_dev, info.st_ino) and content.data == b"first"
    with pytest.raises(KernelTrustError, match="is a symbolic link"):
        native.open_checked(link)
    with pytest.raises(KernelTrustError, match="not the 0{64} graphswap checked"):
        native.open_checked(first, "0" * 64)


# --------------------------------------------------------------------------------------------
# unclear settings
# --------------------------------------------------------------------------------------------

def test_a_bad_bridge_setting_is_one_error_line(attacker, monkeypatch):
    monkeypatch.setenv("GRAPHSWAP_BRIDGE", "bogus")
    out = attacker.tmp / "out.keras"
    result = CliRunner().invoke(main, ["convert", str(SAMPLE_MODEL), "--kernel", "mul8u_drum4",
                                       "-o", str(out)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "in user code" not in result.output, result.output
    assert lines[0].startswith("Error: GRAPHSWAP_BRIDGE='bogus' is not one of")
    assert "auto|op|numpy" in lines[0]
    assert not out.exists()


def test_a_config_dir_that_is_a_file_is_one_error_line(attacker, honest_c, monkeypatch):
    config_file = attacker.tmp / "config-file"
    config_file.write_text("not a folder")
    monkeypatch.setenv("GRAPHSWAP_CONFIG_DIR", str(config_file))
    for args in (["trust", "list"], ["trust", "add", str(honest_c)],
                 ["convert", str(SAMPLE_MODEL), "--kernel", str(honest_c), "-o",
                  str(attacker.tmp / "out.keras")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1, (args, result.output)
        lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert len(lines) == 1 and "unexpected" not in result.output, (args, result.output)
        assert f"GRAPHSWAP_CONFIG_DIR={config_file} names a file, not a folder" in lines[0]
    assert config_file.read_text() == "not a folder"
    assert not (attacker.tmp / "out.keras").exists()
