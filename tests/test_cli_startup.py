"""The `graphswap` command starts without TensorFlow: --help, every command's --help, usage errors,
--version and `graphswap kernels` answer with `tensorflow` never imported (graphswap_command.main
defers graphswap's API; graphswap.cli imports it inside the commands), while `import graphswap`
in a user's program still registers the swapped layers with Keras eagerly."""

from __future__ import annotations

import configparser
import importlib
import json

import keras
import numpy as np
from click.testing import CliRunner
from conftest import REPO, SAMPLE_MODEL, run_python

import graphswap
from graphswap import cli


def _command_paths(group=cli.main, prefix=()) -> list[tuple]:
    """Every command and group of the CLI, as argument prefixes (("convert",), ("kernels",
    "check"), ...)."""
    paths = []
    for name, command in sorted(group.commands.items()):
        paths.append(prefix + (name,))
        if hasattr(command, "commands"):
            paths.extend(_command_paths(command, prefix + (name,)))
    return paths


def _run_deferred(invocations: list[list[str]]) -> dict:
    """Run each argument list through the console entry point in ONE fresh interpreter; return
    {"runs": [{"args", "code", "out"}], "tensorflow": imported?, "keras": imported?}."""
    code = f"""
        import contextlib, io, json, sys
        import graphswap_command
        runs = []
        for args in {invocations!r}:
            sys.argv = ["graphswap", *args]
            out = io.StringIO()
            code = 0
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                try:
                    graphswap_command.main()
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None
                                                                       else 1)
            runs.append({{"args": args, "code": code, "out": out.getvalue()}})
        print("RESULT " + json.dumps({{"runs": runs, "tensorflow": "tensorflow" in sys.modules,
                                      "keras": "keras" in sys.modules}}))
    """
    process = run_python(code, timeout=300, env={"COLUMNS": "80"})
    assert process.returncode == 0, process.stderr[-3000:]
    return json.loads(process.stdout.split("RESULT ", 1)[1])


def test_help_kernels_and_usage_errors_start_without_tensorflow():
    helps = [["--help"], ["-h"]] + [[*path, "--help"] for path in _command_paths()]
    invocations = helps + [["kernels"], ["kernels", "--json"], ["--version"],
                           ["convert"], ["convert", "m.keras", "--backward", "nonsense"]]
    result = _run_deferred(invocations)
    assert result["tensorflow"] is False and result["keras"] is False
    runs = {tuple(run["args"]): run for run in result["runs"]}
    runner = CliRunner()
    assert len(helps) >= 12  # every command and subcommand has a --help
    for args in helps:
        run = runs[tuple(args)]
        assert run["code"] == 0, run
        # the same text the CLI prints in a process that imported everything (this one)
        assert run["out"] == runner.invoke(cli.main, args, prog_name="graphswap",
                                           terminal_width=78).output, args  # click: COLUMNS - 2
    assert "--layer-types" in runs[("convert", "--help")]["out"]
    assert "MultiHeadAttention" in runs[("convert", "--help")]["out"]
    listing = json.loads(runs[("kernels", "--json")]["out"])
    assert listing == graphswap.available_kernels()
    assert runs[("kernels",)]["out"].startswith("exact ")
    assert "graphswap, version" in runs[("--version",)]["out"]
    missing, bad_choice = runs[("convert",)], runs[("convert", "m.keras", "--backward",
                                                    "nonsense")]
    assert missing["code"] == 1 and "Missing argument 'MODEL'" in missing["out"]
    assert bad_choice["code"] == 1 and "'nonsense' is not one of" in bad_choice["out"]


def test_errors_a_command_finds_in_its_own_arguments_come_before_tensorflow():
    """A command checks what it can without the API first: these errors print, exit 1, and
    leave TensorFlow unimported."""
    model = str(SAMPLE_MODEL)
    invocations = [["export", model, "--keep-kernels", "--format", "savedmodel"],
                   ["convert", model, "--bias-correction", "mean"],
                   ["kernels", "check", "nonsense_kernel"]]
    result = _run_deferred(invocations)
    assert result["tensorflow"] is False and result["keras"] is False, result["runs"]
    keep, needs_data, unknown = result["runs"]
    assert keep["code"] == 1 and "--keep-kernels needs --format onnx" in keep["out"]
    assert needs_data["code"] == 1 and "--bias-correction needs --calibrate DATA" in \
        needs_data["out"]
    assert unknown["code"] == 1 and "nonsense_kernel" in unknown["out"]


def test_option_values_are_the_apis():
    """The literal choices/defaults graphswap.cli shows without TensorFlow equal the API's."""
    assert len(cli.OPTION_VALUES) >= 14
    for name, package, api_name in cli.OPTION_VALUES:
        expected = getattr(importlib.import_module(package), api_name)
        actual = getattr(cli, name)
        assert tuple(actual) == tuple(expected) if isinstance(expected, (tuple, list)) \
            else actual == expected, (name, actual, expected)


def test_console_entry_point_is_the_deferring_launcher():
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    scripts = config["options.entry_points"]["console_scripts"]
    assert "graphswap = graphswap_command:main" in scripts
    assert "graphswap_command" in config["options"]["py_modules"]


def test_import_graphswap_still_registers_layers_and_a_deferred_import_loads_on_use(tmp_path):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(3, name="out")(inputs))
    swapped = graphswap.rewrite_model(model, kernel="exact")
    path = tmp_path / "swapped.keras"
    swapped.save(path)
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    expected = swapped.predict(x, verbose=0)
    # a user's program: `import graphswap`, then Keras's own loader
    plain = run_python(f"""
        import sys
        import graphswap
        assert "tensorflow" in sys.modules  # the eager import, as documented
        import keras, numpy as np
        model = keras.models.load_model({str(path)!r})
        np.save({str(tmp_path / 'plain.npy')!r}, model.predict(np.load({str(tmp_path / 'x.npy')!r}),
                                                             verbose=0))
        print(type(model.get_layer("out")).__name__)
    """, timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert plain.stdout.strip().endswith("SwappedDense")
    np.testing.assert_array_equal(np.load(tmp_path / "plain.npy"), expected)
    # the command's process: nothing heavy until a command or an API name needs it
    out = tmp_path / "m.swapped.keras"
    deferred = run_python(f"""
        import sys
        import graphswap_command
        graphswap_command.DEFER_API = True
        import graphswap
        assert "tensorflow" not in sys.modules and "rewrite_model" in dir(graphswap)
        try:
            graphswap.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise AssertionError("an unknown name must raise AttributeError")
        assert "tensorflow" not in sys.modules
        sys.argv = ["graphswap", "convert", {str(path)!r}, "-o", {str(out)!r}, "-k", "mul8u_drum4"]
        try:
            graphswap_command.main()  # a real command: its imports bring TensorFlow
        except SystemExit as exc:
            assert not exc.code, exc.code
        assert "tensorflow" in sys.modules
        import keras
        model = keras.models.load_model({str(out)!r})
        print(type(model.get_layer("out")).__name__, model.get_layer("out").arithmetic.spec,
              graphswap.SwappedDense.__name__)
    """, timeout=300)
    assert deferred.returncode == 0, deferred.stderr[-3000:]
    assert f"wrote {out}" in deferred.stdout
    assert deferred.stdout.strip().endswith("SwappedDense mul8u_drum4 SwappedDense")
