"""A command's --help is short - its essential options and one line naming the others - and
--help-all lists every option it accepts, each group under its heading; the options several
commands share are defined once (one click.Option object, applied by each command)."""

from __future__ import annotations

from click.testing import CliRunner

from graphswap.cli import main
from graphswap.cli.options import QUANTIZATION_OPTIONS

QUANTIZING_COMMANDS = ("convert", "evaluate", "sweep", "explore")


def _help(*args) -> str:
    result = CliRunner().invoke(main, list(args), prog_name="graphswap", terminal_width=78)
    assert result.exit_code == 0, result.output
    return result.output


def _flags(command) -> set:
    return {flag for param in command.params for flag in [*param.opts, *param.secondary_opts]
            if flag.startswith("-")}


def test_evaluate_help_is_short_and_names_help_all():
    text = _help("evaluate", "--help")
    assert len(text.splitlines()) < 60, text
    assert "--help-all" in text
    assert "--calibrate" not in text and "--custom-objects" not in text
    assert "15 quantization and calibration options" in " ".join(text.split())
    assert "--data" in text and "--kernel" in text


def test_evaluate_help_all_lists_every_option_under_its_heading():
    command = main.commands["evaluate"]
    text = _help("evaluate", "--help-all")
    shown = {word.rstrip(",") for line in text.splitlines() for word in line.split()
             if word.startswith("-")}
    missing = _flags(command) - shown
    assert not missing, missing
    for heading in ("Options:", "More options:", "Data and task options:",
                    "Quantization and calibration options:", "Model loading options:"):
        assert heading in text
    assert text.index("Quantization and calibration options:") < text.index("--calibrate ")
    assert "--help-all shows every option" not in text


def test_every_command_help_all_lists_its_options():
    for name, command in main.commands.items():
        if hasattr(command, "commands"):
            continue
        text = _help(name, "--help-all" if "--help-all" in _help(name, "--help") else "--help")
        missing = {flag for flag in _flags(command) if flag not in text}
        assert not missing, (name, missing)


def test_each_quantization_option_is_defined_once():
    """convert, evaluate, sweep and explore take the same option objects, in the same order."""
    names = {option.name for option in QUANTIZATION_OPTIONS}
    assert len(names) == len(QUANTIZATION_OPTIONS) >= 15
    for command_name in QUANTIZING_COMMANDS:
        params = [param for param in main.commands[command_name].params if param.name in names]
        assert params == list(QUANTIZATION_OPTIONS), command_name
        assert all(param is option for param, option in zip(params, QUANTIZATION_OPTIONS))
    assert "--calibrate" not in _flags(main.commands["finetune"])


def test_shared_data_and_loading_options_are_one_object_each():
    def by_name(command_name):
        return {param.name: param for param in main.commands[command_name].params}

    for shared in ("scale", "pad", "resize", "loss", "custom_objects", "unsafe", "trust_kernel"):
        objects = {id(by_name(name)[shared]) for name in ("finetune", "evaluate", "sweep")}
        assert len(objects) == 1, shared


def test_a_command_without_hidden_options_has_no_help_all():
    text = _help("trust", "add", "--help")
    assert "--help-all" not in text
    assert CliRunner().invoke(main, ["trust", "add", "--help-all"]).exit_code == 1
