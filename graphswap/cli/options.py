"""The options several commands share, each defined once and applied by every command that takes
it (as flask's cli shares its options): the quantization and calibration options, the data and
task options, the model loading options, and the output, --plot, --force and --json options.

A shared option is one click.Option object; a decorator (quantization_options, data_options,
model_loading_options, ...) adds those objects to a command.  Their section (help.py) says under
which heading --help-all shows them.  The parameter types that check a value while parsing -
before any work is done - are here too (OutputFile, ModelOutput, LEARNING_RATE).
"""

from __future__ import annotations

import functools
from pathlib import Path

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.help import DATA, LOADING, MORE, QUANTIZATION, SectionOption
from graphswap.cli.values import (CALIBRATION_METHODS, CALIBRATION_SOURCES, COMPENSATION_METHODS,
                                  DEFAULT_BN_REESTIMATION, DEFAULT_CALIBRATION_METHOD,
                                  DEFAULT_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SOURCE,
                                  DEFAULT_SEQUENCE_LENGTH, LAYER_TYPES, MAX_SEQUENCE_LENGTH,
                                  MIN_CALIBRATION_SAMPLES, OPERAND_CHOICES, QUANTIZATION_PRESETS)
from graphswap.errors import GraphswapError, OutputPathError
from graphswap.methods import CALIBRATION_REGISTRY, COMPENSATION_REGISTRY

#: click.option for a command's own less used options: shown by --help-all only
more_option = functools.partial(click.option, cls=SectionOption, section=MORE)


def attach(*options):
    """A decorator adding these option objects to a command, shown in this order (click lists a
    command's options from the top decorator down)."""
    def decorator(command):
        if not hasattr(command, "__click_params__"):
            command.__click_params__ = []
        command.__click_params__.extend(reversed(options))
        return command
    return decorator


class OutputFile(click.Path):
    """An output file path whose ending is one of `suffixes` (checked while parsing, before any
    work is done)."""

    def __init__(self, suffixes):
        super().__init__(dir_okay=False)
        self.suffixes = tuple(suffixes)

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        if Path(value).suffix.lower() not in self.suffixes:
            option = "/".join(param.opts) if param is not None else "output"
            raise OutputPathError(f"{option} {value} must end in {' or '.join(self.suffixes)}")
        return value


class ModelOutput(click.Path):
    """Where a model is written: a .keras or .h5 file, or a graphswap SavedModel directory (a path
    without a suffix or ending in '/'); checked while parsing (io.model_output_format)."""

    def convert(self, value, param, ctx):
        import_tensorflow_quietly()   # before the API, which imports it
        from graphswap import io
        value = super().convert(value, param, ctx)
        io.model_output_format(value)
        return value


MODEL_OUTPUT_HELP = (".keras, .h5, or a directory (no suffix, or ending in '/'): a graphswap "
                     "SavedModel that serves without graphswap and reopens in graphswap")


class _LearningRate(click.ParamType):
    """--lr: a number >= 0, or "auto"."""

    name = "RATE|auto"

    def convert(self, value, param, ctx):
        import_tensorflow_quietly()   # before the API, which imports it
        from graphswap import research
        try:
            return research.check_learning_rate(value)
        except GraphswapError as exc:
            self.fail(str(exc), param, ctx)


LEARNING_RATE = _LearningRate()


# --- output, --plot, --force, --json ---------------------------------------------------------

def force_option(what="the output if it exists"):
    return click.option("-f", "--force", is_flag=True, help=f"Overwrite {what}.")


def json_option(what: str | None = "the result"):
    return click.option("--json", "as_json", is_flag=True,
                        help=f"Print {what} as JSON." if what else "Print as JSON.")


def plot_option(what):
    return click.option("--plot", type=OutputFile((".png",)), help=f"Write {what} as PNG.")


def selection_options(include="As for convert.", exclude="As for convert."):
    """--include and --exclude REGEX (layers by name/path), shared by the commands that select
    layers; convert's help says what they do, the others' point to it."""
    def decorate(command):
        command = click.option("--exclude", multiple=True, metavar="REGEX", help=exclude)(command)
        return click.option("--include", multiple=True, metavar="REGEX", help=include)(command)
    return decorate


def _layer_types(ctx, param, values):
    """--layer-types: repeatable and/or comma-separated type names; () means every type."""
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    if not names:
        return None
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import swap
    try:
        return swap.check_layer_types(names)
    except GraphswapError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def layer_types_option(what):
    return click.option(
        "--layer-types", "--type", "layer_types", multiple=True, callback=_layer_types,
        metavar="TYPE[,TYPE]",
        help=f"Layer types to {what} (repeatable or comma-separated; --type is the older name): "
             f"{', '.join(LAYER_TYPES)} [default: all of them].")


def sequence_length_option(what, default=f"{DEFAULT_SEQUENCE_LENGTH}"):
    return more_option(
        "--sequence-length", type=click.IntRange(min=1, max=MAX_SEQUENCE_LENGTH), default=None,
        metavar="N",
        help=f"The length the model's free (None) input dimensions - a sequence of any length, "
             f"an image of any size - take {what} [default: {default}].")


# --- model loading ---------------------------------------------------------------------------

def _trust_kernels(ctx, param, paths):
    from graphswap.kernels import trust as trust_store
    for path in paths:
        try:
            trust_store.trust(path)
        except GraphswapError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return paths


MODEL_LOADING_OPTIONS = (
    SectionOption(["--custom-objects"], type=click.Path(dir_okay=False), section=LOADING,
                  help="Python module whose classes/functions the model needs (custom layers)."),
    SectionOption(["--trust-kernel"], multiple=True, type=click.Path(dir_okay=False),
                  expose_value=False, callback=_trust_kernels, metavar="PATH", section=LOADING,
                  help="Trust this kernel library / multiplier source named by the model, for "
                       "this command (repeatable); to trust it for good: 'graphswap trust add "
                       "PATH'."),
    SectionOption(["--unsafe"], is_flag=True, section=LOADING,
                  help="Allow loading Lambda layers (runs Python code stored in the model: only "
                       "for files you trust)."),
)
#: --custom-objects, --trust-kernel and --unsafe, shared by the commands that load models
model_loading_options = attach(*MODEL_LOADING_OPTIONS)


# --- data and task ---------------------------------------------------------------------------

DATA_HELP = {
    "train": "Training data: .npz (x_train/y_train, else x/y) or an image directory with one "
             "folder per class.",
    "evaluation": "Evaluation data: .npz (x_test/y_test, else x/y) or an image directory.",
    "validation": "Validation data: .npz (x_test/y_test, else x/y) or an image directory.",
}


def data_option(kind: str):
    """--data PATH (required), of the kind DATA_HELP names."""
    return click.option("--data", "data_path", required=True, type=click.Path(),
                        help=DATA_HELP[kind])


DATA_OPTIONS = (
    SectionOption(["--resize"], is_flag=True, section=DATA,
                  help="Resize images of another size to the model's input size (bilinear)."),
    SectionOption(["--pad"], is_flag=True, section=DATA,
                  help="Zero-pad (centred) smaller images to the model's input size."),
    SectionOption(["--scale"], default=None, metavar="FACTOR", section=DATA,
                  help="Multiply inputs by FACTOR (e.g. 1/255) - only for models without their "
                       "own Rescaling layer."),
)
#: --resize, --pad and --scale, shared by finetune, evaluate, sweep and explore
data_options = attach(*DATA_OPTIONS)

LOSS_OPTION = SectionOption(
    ["--loss"], default=None, metavar="NAME", section=DATA,
    help="The loss that decides the task, instead of the one saved with the model: "
         "sparse_categorical_crossentropy, categorical_crossentropy, binary_crossentropy, mse, "
         "mae, huber, ...")
METRICS_HELP = ("Metrics to report (and compile with): accuracy, top5_accuracy, agreement, loss, "
                "mse, mae, psnr, r2, max_abs_diff; the first is the score compared [default: the "
                "task's: accuracy for classifiers, r2 for regression].")
METRICS_OPTIONS = {flag: SectionOption([flag, "task_metrics"], default=None, section=DATA,
                                       metavar="NAME[,NAME...]", help=METRICS_HELP)
                   for flag in ("--metrics", "--task-metrics")}


def task_options(metrics_option="--metrics"):
    """--loss and --metrics (explore: --task-metrics, its --metrics is the hardware table):
    override the task the saved loss implies (graphswap.research.data.task), shared by finetune,
    evaluate, sweep and explore."""
    return attach(LOSS_OPTION, METRICS_OPTIONS[metrics_option])


# --- quantization and calibration ------------------------------------------------------------

#: --bias-correction's off switch, a choice of the command line's (no compensation method)
BIAS_CORRECTION_OFF = ("none", "no compensation")


def _quantization(*declarations, **attributes) -> SectionOption:
    return SectionOption(list(declarations), section=QUANTIZATION, **attributes)


QUANTIZATION_OPTIONS = (
    _quantization(
        "--calibrate", type=click.Path(), default=None, metavar="DATA",
        help="Representative inputs (.npz: x_train, else x; or an image folder): multiplier "
             "layers get static activation ranges calibrated on them, as hardware runs (the "
             "default whenever given). Without it activations are quantized per call ('dynamic', "
             "as TFApprox), so a result depends on the batch."),
    _quantization(
        "--calibration-samples", type=click.IntRange(min=1), default=DEFAULT_CALIBRATION_SAMPLES,
        show_default=True,
        help=f"Calibration examples to use (first N; at least {MIN_CALIBRATION_SAMPLES})."),
    _quantization(
        "--calibration-method", type=click.Choice(list(CALIBRATION_METHODS)),
        default=DEFAULT_CALIBRATION_METHOD,
        help=CALIBRATION_REGISTRY.help("Range of each layer's input")),
    _quantization(
        "--calibration-source", type=click.Choice(list(CALIBRATION_SOURCES)),
        default=DEFAULT_CALIBRATION_SOURCE, show_default=True,
        help="Observe each layer's input in the float model, or with the layers before it "
             "already approximate ('approximate', layer by layer)."),
    _quantization(
        "--bias-correction", type=click.Choice([BIAS_CORRECTION_OFF[0], *COMPENSATION_METHODS]),
        default=None,
        help=COMPENSATION_REGISTRY.help("With --calibrate: compensate each multiplier layer's "
                                        "product error per output channel",
                                        extra=[BIAS_CORRECTION_OFF], when=" with --calibrate")),
    _quantization(
        "--weight-tuning/--no-weight-tuning", default=None,
        help="With --calibrate: replace each multiplier layer's weight codes by the codes whose "
             "approximate products best match the exact ones over the layer's calibrated inputs "
             "(ALWANN's weight tuning; docs/RECOVERY.md) [default with --calibrate: measured - "
             "the model with and without it, the one closer to the original kept]."),
    _quantization(
        "--recalibrate-bn/--no-recalibrate-bn", "calibration_bn", default=None,
        help="With --calibrate: re-estimate BatchNormalization statistics with the approximate "
             "forward (no gradient steps) [default with --calibrate: "
             f"{'on' if DEFAULT_BN_REESTIMATION else 'off'} for a model with "
             "BatchNormalization]."),
    _quantization(
        "--dynamic-fallback/--no-dynamic-fallback", default=None,
        help="With --calibrate: also build the uncalibrated (dynamic) conversion and keep it when "
             "it is closer to the original on the calibration data (the report says which was "
             "kept) [default: on]."),
    _quantization(
        "--operands", type=click.Choice([c.replace("_", "-") for c in OPERAND_CHOICES]),
        default=None,
        help="Which multiplier input the weights feed: 'activation-first' (the activation is "
             "operand A), 'weight-first', or 'auto': measured per layer on the calibration data, "
             "with the activation code offset where a port drops low bits [default with "
             "--calibrate: auto; without: activation-first]."),
    _quantization(
        "--quantization", type=click.Choice(list(QUANTIZATION_PRESETS)), default="default",
        show_default=True,
        help="'tfapprox': asymmetric per-tensor weights, as TFApprox (signed multipliers keep "
             "symmetric per-channel)."),
    _quantization(
        "--weights", type=click.Choice(["sign-magnitude", "asymmetric", "symmetric"]),
        default=None,
        help="Weight encoding [default: sign-magnitude for unsigned multipliers (a "
             "sign-magnitude MAC), symmetric int8 for signed ones]; asymmetric uint8 with a zero "
             "point is TFApprox's."),
    _quantization(
        "--weight-granularity", type=click.Choice(["per-channel", "per-tensor"]), default=None,
        help="Weight scales per output channel [default] or one per tensor."),
    _quantization(
        "--observer", type=click.Choice(["fixed", "moving-average"]), default="fixed",
        show_default=True,
        help="Static ranges during fine-tuning: fixed, or following a moving average of the "
             "observed ranges (as QAT observers)."),
    _quantization(
        "--observer-momentum", type=click.FloatRange(0, 1, max_open=True), default=0.99,
        show_default=True, help="Momentum of the moving-average observer."),
    _quantization(
        "--fold-batchnorm", is_flag=True,
        help="Fold each Dense/Conv2D + BatchNormalization pair into one layer before quantizing, "
             "as int8 accelerators run it."),
)
#: the parameter names quantization_options collects into the command's `rewrite` dict
QUANTIZATION_PARAMS = tuple(option.name for option in QUANTIZATION_OPTIONS)


def quantization_options(command):
    """How multiplier layers quantize, static calibration, and the zero-step recovery options,
    shared by convert, evaluate, sweep and explore; the command receives them as one dict
    `rewrite` (running.rewrite_options turns it into the API's keyword arguments)."""
    @functools.wraps(command)
    def collect(*args, **kwargs):
        kwargs["rewrite"] = {name: kwargs.pop(name) for name in QUANTIZATION_PARAMS}
        return command(*args, **kwargs)

    return attach(*QUANTIZATION_OPTIONS)(collect)
