"""The `graphswap` command line: thin click commands over the Python API.

Every command parses its options (validation in click types and callbacks), calls the API, and
prints.  Errors graphswap raises on bad input (GraphswapError) print as one `Error: ...` line with
exit code 1; click's usage errors (unknown option, bad choice, missing argument) exit 1 too;
anything unexpected prints one line too (set GRAPHSWAP_DEBUG=1 for the traceback).

One file, longer than the package's other modules, because it is nothing but the click
declarations of every command (options, help texts); all the logic is in the API it calls.

Importing this module imports no TensorFlow: `graphswap --help`, every command's --help, usage
errors and `graphswap kernels` answer at once.  The API subpackages are imported on their first
use inside a command (`io`, `research`, `swap` below import TensorFlow, quietly, then; `kernels`
does not), and the option choices and defaults the help texts show are literal values here
(tests/test_cli_startup.py holds each to the API's own).  The console command's entry point is
graphswap_command.main (docs/ARCHITECTURE.md, "The command starts without TensorFlow").
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import shlex
import sys
from pathlib import Path

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap._version import __version__
from graphswap.errors import GraphswapError, KernelTrustError, OutputPathError, TrustStoreError
from graphswap.tables import format_table


class LazyModule:
    """A graphswap subpackage imported on first attribute access (TensorFlow first, quietly,
    for those that need it), so that merely loading the command line imports nothing heavy."""

    def __init__(self, name: str, tensorflow: bool = True):
        self._name, self._tensorflow, self._module = name, tensorflow, None

    def __getattr__(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        if self._module is None:
            if self._tensorflow:
                import_tensorflow_quietly()
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)


io = LazyModule("graphswap.io")
research = LazyModule("graphswap.research")
swap = LazyModule("graphswap.swap")
kernels = LazyModule("graphswap.kernels", tensorflow=False)   # no TensorFlow: kernels' list
trust_store = LazyModule("graphswap.kernels.trust", tensorflow=False)

# Option choices and defaults shown by --help, as literal values (no TensorFlow to read them from
# the API); tests/test_cli_startup.py::test_option_values_are_the_apis fails when one drifts.
LAYER_TYPES = ("Dense", "Conv2D", "DepthwiseConv2D", "SeparableConv2D", "Conv1D",
               "Conv2DTranspose", "EinsumDense", "MultiHeadAttention", "LSTM", "GRU",
               "SimpleRNN", "RNN", "Bidirectional", "TimeDistributed")  # swap.LAYER_TYPES
MAX_CHECK_BATCH = 1024                                                  # swap.MAX_CHECK_BATCH
DEFAULT_SEQUENCE_LENGTH = 16                                    # swap.DEFAULT_SEQUENCE_LENGTH
MAX_SEQUENCE_LENGTH = 65536                                     # swap.MAX_SEQUENCE_LENGTH
BACKWARD_MODES = ("native", "kernel", "lut_grad")                       # swap.BACKWARD_MODES
COMPENSATION_METHODS = ("mean", "moments")                              # swap.COMPENSATION_METHODS
DEFAULT_COMPENSATION = "moments"                                        # with --calibrate
DEFAULT_WEIGHT_TUNING = False                                           # with --calibrate
DEFAULT_BN_REESTIMATION = True                                  # with --calibrate, BN models
DEFAULT_RECIPE = "default"                                      # swap.DEFAULT_RECIPE
CALIBRATION_SOURCES = ("float", "approximate")                          # swap.CALIBRATION_SOURCES
DEFAULT_CALIBRATION_SOURCE = "approximate"   # measured: docs/RECOVERY.md, ResNet-8 on CIFAR-10
CALIBRATION_METHODS = ("minmax", "percentile", "mse", "entropy", "output")  # swap.CALIBRATION_...
DEFAULT_CALIBRATION_METHOD = "output"
DEFAULT_CALIBRATION_SAMPLES = 512
MIN_CALIBRATION_SAMPLES = 16
QUANTIZATION_PRESETS = ("default", "tfapprox")                          # swap.QUANTIZATION_PRESETS
OPERAND_CHOICES = ("auto", "activation_first", "weight_first")          # swap.OPERAND_CHOICES
CHECK_SAMPLES = 512                                                     # swap.CHECK_SAMPLES
DEFAULT_LEARNING_RATE = "auto"                                          # research.DEFAULT_...
SCHEDULES = ("constant", "cosine")                                      # research.SCHEDULES
DEFAULT_SCHEDULE = "cosine"
DEFAULT_BATCH_SIZE = 32                                                 # research.DEFAULT_...
#: (cli constant, API subpackage, API name): what the startup test compares
OPTION_VALUES = tuple((name, package, name) for package, names in (
    ("graphswap.swap", ("LAYER_TYPES", "MAX_CHECK_BATCH", "BACKWARD_MODES", "COMPENSATION_METHODS",
                        "DEFAULT_COMPENSATION", "DEFAULT_WEIGHT_TUNING",
                        "DEFAULT_BN_REESTIMATION", "DEFAULT_RECIPE",
                        "CALIBRATION_SOURCES", "DEFAULT_CALIBRATION_SOURCE", "CALIBRATION_METHODS",
                        "DEFAULT_CALIBRATION_METHOD", "DEFAULT_CALIBRATION_SAMPLES",
                        "MIN_CALIBRATION_SAMPLES", "QUANTIZATION_PRESETS", "OPERAND_CHOICES",
                        "CHECK_SAMPLES", "DEFAULT_SEQUENCE_LENGTH", "MAX_SEQUENCE_LENGTH")),
    ("graphswap.research", ("DEFAULT_LEARNING_RATE", "SCHEDULES", "DEFAULT_SCHEDULE",
                            "DEFAULT_BATCH_SIZE")))
    for name in names)

EXIT_ERROR = 1


def report_errors(run):
    """Run `run()`, turning exceptions into one clear line and exit code 1: graphswap's own
    errors (bad input) with their message; click's usage errors as click shows them, exit 1 too."""
    try:
        return run()
    except click.UsageError as exc:
        exc.exit_code = EXIT_ERROR   # every error exits 1 (README), not click's 2
        raise
    except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
        raise
    except GraphswapError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        click.echo("Interrupted; no output was written.", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - last resort: one line, no traceback
        if os.environ.get("GRAPHSWAP_DEBUG"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if type(exc).__module__.startswith("tensorflow"):
            first = swap.tensorflow_reason(exc)  # not Keras' "Exception encountered when ..."
        click.echo(f"Error: unexpected {type(exc).__name__}: {first} "
                   f"(set GRAPHSWAP_DEBUG=1 to see the traceback)", err=True)
        sys.exit(EXIT_ERROR)


class ReportingGroup(click.Group):
    """A click group whose commands - their option parsing included - report errors in one line
    (see report_errors)."""

    def make_context(self, *args, **kwargs):  # the group's own options: usage errors exit 1
        return report_errors(lambda: super(ReportingGroup, self).make_context(*args, **kwargs))

    def invoke(self, ctx):
        def run():
            trust_store.config_dir()  # $GRAPHSWAP_CONFIG_DIR naming a file: refused before work
            return super(ReportingGroup, self).invoke(ctx)

        _print_names_as_given()
        return report_errors(run)


def _print_names_as_given() -> None:
    """Print a file name holding bytes that are no UTF-8 as the bytes it has (as ls does), instead
    of failing on them with a UnicodeEncodeError (a strict UTF-8 locale's stdout)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (getattr(stream, "encoding", "") or "").lower().replace(
                "-", "") == "utf8":
            try:
                reconfigure(errors="surrogateescape")
            except (ValueError, OSError):   # a stream that cannot change (already written to)
                pass


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
        value = super().convert(value, param, ctx)
        io.model_output_format(value)
        return value


MODEL_OUTPUT_HELP = (".keras, .h5, or a directory (no suffix, or ending in '/'): a graphswap "
                     "SavedModel that serves without graphswap and reopens in graphswap")


def _trust_kernels(ctx, param, paths):
    for path in paths:
        try:
            trust_store.trust(path)
        except GraphswapError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return paths


def _record_named_kernels(specs, written=None) -> list:
    """A kernel file named on the command line is the user's approval: record it in the trust
    store, so later commands need no --trust-kernel.  Called before the command's work, so a
    store that cannot be written (a full disk under the config folder) stops the command before
    it writes anything; a spec graphswap refuses to record is tried again after the work
    (_say_recorded), where its error is said as before.  `written`: what the command already
    wrote (it records only after its work).  Returns the contents newly recorded and the specs
    to try again."""
    recorded = []
    for spec in specs:
        if spec is None:
            continue
        try:
            remembered, reason = kernels.remember_named_file(spec), None
        except TrustStoreError as exc:   # a store that cannot be written: stop before the work
            if exc.reason is None:
                raise   # a lock or store file that is not a plain file: said as it is
            reason = exc.reason
        except GraphswapError:
            if written is not None:
                raise
            recorded.append(spec)
            continue
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if reason is not None:
            done = (f"{written} was written, but later commands will need --trust-kernel {spec} "
                    f"(or 'graphswap trust add {spec}' once the store can be written)"
                    if written is not None else "nothing was written")
            raise OutputPathError(
                f"recording the kernel file {spec} in the trust store {trust_store.store_path()} "
                f"failed: {reason}; graphswap records the kernel files you name there so that "
                f"later commands need no --trust-kernel. Free some space there (or set "
                f"GRAPHSWAP_CONFIG_DIR to a writable folder) and run the command again; "
                f"{done}") from None
        if remembered is not None and remembered[1]:
            recorded.append(remembered[0])
    return recorded


def _say_recorded(recorded, err: bool = False, written="the output") -> None:
    """One line for each kernel file newly recorded in the trust store, with how to undo it (a
    spec _record_named_kernels left for after the work is recorded now)."""
    for item in filter(None, recorded):
        for content in (_record_named_kernels([item], written) if isinstance(item, str)
                        else [item]):
            click.echo(f"trusted {content.path} (sha256 {content.sha256[:16]}...) for later "
                       f"graphswap commands; undo with: graphswap trust remove {content.path}",
                       err=err)


def model_loading_options(command):
    """--custom-objects, --unsafe and --trust-kernel, shared by the commands that load models."""
    command = click.option(
        "--custom-objects", type=click.Path(dir_okay=False),
        help="Python module whose classes/functions the model needs (custom layers).")(command)
    command = click.option(
        "--trust-kernel", multiple=True, type=click.Path(dir_okay=False), expose_value=False,
        callback=_trust_kernels, metavar="PATH",
        help="Trust this kernel library / multiplier source named by the model, for this "
             "command (repeatable); to trust it for good: 'graphswap trust add PATH'.")(command)
    command = click.option(
        "--unsafe", is_flag=True,
        help="Allow loading Lambda layers (runs Python code stored in the model: only for files "
             "you trust).")(command)
    return command


def _layer_types(ctx, param, values):
    """--layer-types: repeatable and/or comma-separated type names; () means every type."""
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    try:
        return swap.check_layer_types(names) if names else None
    except GraphswapError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


class _LearningRate(click.ParamType):
    """--lr: a number >= 0, or "auto"."""

    name = "RATE|auto"

    def convert(self, value, param, ctx):
        try:
            return research.check_learning_rate(value)
        except GraphswapError as exc:
            self.fail(str(exc), param, ctx)


LEARNING_RATE = _LearningRate()


def layer_types_option(what):
    return click.option(
        "--layer-types", "--type", "layer_types", multiple=True, callback=_layer_types,
        metavar="TYPE[,TYPE]",
        help=f"Layer types to {what} (repeatable or comma-separated; --type is the older name): "
             f"{', '.join(LAYER_TYPES)} [default: all of them].")


def sequence_length_option(what, default=f"{DEFAULT_SEQUENCE_LENGTH}"):
    return click.option(
        "--sequence-length", type=click.IntRange(min=1, max=MAX_SEQUENCE_LENGTH), default=None,
        metavar="N",
        help=f"The length the model's free (None) input dimensions - a sequence of any length, "
             f"an image of any size - take {what} [default: {default}].")


class SweepProgress:
    """A click progress bar on stderr for sweep's progress(done, total, label) callback."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def __call__(self, done, total, label):
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = click.progressbar(length=total, label="sweep", file=sys.stderr,
                                         show_pos=True, item_show_func=lambda item: item)
            self.bar.__enter__()
        self.bar.update(1, label)

    def close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
QUANTIZATION_PARAMS = ("quantization", "weights", "weight_granularity", "observer",
                       "observer_momentum", "calibrate", "calibration_samples",
                       "calibration_method", "calibration_source", "bias_correction",
                       "calibration_bn", "fold_batchnorm", "weight_tuning", "operands",
                       "dynamic_fallback")


def quantization_options(command):
    """How multiplier layers quantize, static calibration, and the zero-step recovery options,
    shared by convert, evaluate and sweep; the command receives them as one dict `rewrite`."""
    @functools.wraps(command)
    def collect(*args, **kwargs):
        kwargs["rewrite"] = {name: kwargs.pop(name) for name in QUANTIZATION_PARAMS}
        return command(*args, **kwargs)

    options = [
        click.option("--fold-batchnorm", is_flag=True,
                     help="Fold each Dense/Conv2D + BatchNormalization pair into one layer "
                          "before quantizing, as int8 accelerators run it."),
        click.option("--recalibrate-bn/--no-recalibrate-bn", "calibration_bn", default=None,
                     help="With --calibrate: re-estimate BatchNormalization statistics with the "
                          "approximate forward (no gradient steps) [default with --calibrate: "
                          f"{'on' if DEFAULT_BN_REESTIMATION else 'off'} for a model with "
                          "BatchNormalization]."),
        click.option("--weight-tuning/--no-weight-tuning", default=None,
                     help="With --calibrate: replace each multiplier layer's weight codes by the "
                          "codes whose approximate products best match the exact ones over the "
                          "layer's calibrated inputs (ALWANN's weight tuning; docs/RECOVERY.md)"
                          " [default with --calibrate: measured - the model with and without "
                          "it, the one closer to the original kept]."),
        click.option("--bias-correction", type=click.Choice(["none", *COMPENSATION_METHODS]),
                     default=None,
                     help="With --calibrate: compensate each multiplier layer's product error "
                          "per output channel - 'mean' (mean error) or 'moments' (mean and "
                          f"spread), or 'none' [default with --calibrate: {DEFAULT_COMPENSATION},"
                          f" the best measured, see docs/RECOVERY.md]."),
        click.option("--calibration-source", type=click.Choice(list(CALIBRATION_SOURCES)),
                     default=DEFAULT_CALIBRATION_SOURCE, show_default=True,
                     help="Observe each layer's input in the float model, or with the layers "
                          "before it already approximate ('approximate', layer by layer)."),
        click.option("--calibration-method", type=click.Choice(list(CALIBRATION_METHODS)),
                     default=DEFAULT_CALIBRATION_METHOD, show_default=True,
                     help="Range of each layer's input: min/max, the 99.99th percentile, the "
                          "clipping range of least quantization error, of least KL divergence "
                          "(TensorRT's entropy calibrator), or the percentile range narrowed "
                          "where the layer's output through the multiplier errs less ('output')."),
        click.option("--calibration-samples", type=click.IntRange(min=1),
                     default=DEFAULT_CALIBRATION_SAMPLES, show_default=True,
                     help=f"Calibration examples to use (first N; at least "
                          f"{MIN_CALIBRATION_SAMPLES})."),
        click.option("--calibrate", type=click.Path(), default=None, metavar="DATA",
                     help="Representative inputs (.npz: x_train, else x; or an image folder): "
                          "multiplier layers get static activation ranges calibrated on them, "
                          "as hardware runs (the default whenever given). Without it activations "
                          "are quantized per call ('dynamic', as TFApprox), so a result depends "
                          "on the batch."),
        click.option("--observer-momentum", type=click.FloatRange(0, 1, max_open=True),
                     default=0.99, show_default=True,
                     help="Momentum of the moving-average observer."),
        click.option("--observer", type=click.Choice(["fixed", "moving-average"]),
                     default="fixed", show_default=True,
                     help="Static ranges during fine-tuning: fixed, or following a moving average "
                          "of the observed ranges (as QAT observers)."),
        click.option("--weight-granularity", type=click.Choice(["per-channel", "per-tensor"]),
                     default=None,
                     help="Weight scales per output channel [default] or one per tensor."),
        click.option("--weights", type=click.Choice(["sign-magnitude", "asymmetric",
                                                     "symmetric"]), default=None,
                     help="Weight encoding [default: sign-magnitude for unsigned multipliers "
                          "(a sign-magnitude MAC), symmetric int8 for signed ones]; asymmetric "
                          "uint8 with a zero point is TFApprox's."),
        click.option("--dynamic-fallback/--no-dynamic-fallback", default=None,
                     help="With --calibrate: also build the uncalibrated (dynamic) conversion and "
                          "keep it when it is closer to the original on the calibration data "
                          "(the report says which was kept) [default: on]."),
        click.option("--operands", type=click.Choice([c.replace("_", "-")
                                                      for c in OPERAND_CHOICES]),
                     default=None,
                     help="Which multiplier input the weights feed: 'activation-first' (the "
                          "activation is operand A), 'weight-first', or 'auto': measured per "
                          "layer on the calibration data, with the activation code offset "
                          "where a port drops low bits [default with --calibrate: auto; "
                          "without: activation-first]."),
        click.option("--quantization", type=click.Choice(list(QUANTIZATION_PRESETS)),
                     default="default", show_default=True,
                     help="'tfapprox': asymmetric per-tensor weights, as TFApprox (signed "
                          "multipliers keep symmetric per-channel)."),
    ]
    for option in options:
        collect = option(collect)
    return collect


def _rewrite_options(rewrite: dict, model=None, ctx=None) -> dict:
    """rewrite_model's keyword arguments from the quantization options (calibration data read
    for `model` when given, else passed on as a path)."""
    explicit = {k: rewrite[k] for k in ("weights", "weight_granularity") if rewrite[k]}
    if rewrite["quantization"] == "tfapprox" and explicit:
        raise click.UsageError("--quantization tfapprox fixes the weight encoding and "
                               "granularity; drop --weights/--weight-granularity, or use them "
                               "without the preset")
    if rewrite["calibrate"] is None:
        needing = [f"--{name.replace('_', '-')}" for name in ("bias_correction", "calibration_bn",
                                                               "weight_tuning")
                   if rewrite[name] and rewrite[name] != "none"]
        needing += ["--operands auto"] if rewrite["operands"] == "auto" else []
        needing += ["--dynamic-fallback"] if rewrite["dynamic_fallback"] else []
        if ctx is not None:
            needing += [f"--{name.replace('_', '-')}"
                        for name in ("calibration_samples", "calibration_method",
                                     "calibration_source")
                        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if needing:
            raise click.UsageError(f"{', '.join(needing)} "
                                   f"{'needs' if len(needing) == 1 else 'need'} --calibrate DATA")
    quantization = rewrite["quantization"]
    if quantization != "tfapprox":
        quantization = {"weights": (rewrite["weights"] or "").replace("-", "_") or None,
                        "granularity": (rewrite["weight_granularity"] or "per-channel")
                        .replace("-", "_"),
                        "observer": rewrite["observer"].replace("-", "_"),
                        "momentum": rewrite["observer_momentum"]}
    options = {"quantization": quantization, "fold_batchnorm": rewrite["fold_batchnorm"]}
    if rewrite["operands"] is not None:
        options["operands"] = rewrite["operands"].replace("-", "_")
    if rewrite["calibrate"] is not None:
        data = rewrite["calibrate"]
        if model is not None:
            # the examples beyond those calibrated on are the zero-step check's (swap.fallback)
            data = research.calibration_arrays(data, model, rewrite["calibration_samples"]
                                               + CHECK_SAMPLES)
        options.update(calibration_data=data,
                       calibration_samples=rewrite["calibration_samples"],
                       calibration_method=rewrite["calibration_method"],
                       calibration_source=rewrite["calibration_source"],
                       bias_correction=_default_recipe(rewrite)[0],
                       recalibrate_bn=(DEFAULT_RECIPE if rewrite["calibration_bn"] is None
                                       else rewrite["calibration_bn"]))
        if rewrite["weight_tuning"] is not None:   # else measured, with and without
            options["weight_tuning"] = bool(rewrite["weight_tuning"])
        if rewrite["dynamic_fallback"] is not None:
            options["dynamic_fallback"] = rewrite["dynamic_fallback"]
    return options


def _default_recipe(rewrite: dict) -> tuple:
    """(bias_correction, weight_tuning) with --calibrate: the options as given, the best measured
    recipe (DEFAULT_COMPENSATION, DEFAULT_WEIGHT_TUNING) where not given; 'none' is None."""
    bias = rewrite["bias_correction"]
    bias = DEFAULT_COMPENSATION if bias is None else (None if bias == "none" else bias)
    tuning = rewrite["weight_tuning"]
    return bias, DEFAULT_WEIGHT_TUNING if tuning is None else bool(tuning)


def _load(path, custom_objects=None, unsafe=False):
    return io.load_model(path, custom_objects=custom_objects, safe_mode=not unsafe)


@click.group(cls=ReportingGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="graphswap")
@click.option("--compile-c-unsandboxed", is_flag=True,
              help="On a kernel without Landlock: compile and run .c multipliers unconfined "
                   "(what they make the compiler read is then not covered by your trust).")
def main(compile_c_unsandboxed):
    """Rewrite Keras models so their layers' forward products run your C arithmetic.

    Typical session:

    \b
      graphswap convert model.keras --kernel mul8u_drum4
      graphswap finetune model.swapped.keras --data train.npz
      graphswap evaluate model.keras --data test.npz --kernel exact --kernel mul8u_drum4
    """
    if compile_c_unsandboxed:   # read where the source is compiled (graphswap.native.sandbox)
        os.environ["GRAPHSWAP_UNSANDBOXED_COMPILE"] = "1"


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("-o", "--output", type=ModelOutput(),
              help=f"Where to write the rewritten model: {MODEL_OUTPUT_HELP} [default: MODEL's "
                   f"name + .swapped.keras; NAME_swapped_savedmodel/ when MODEL is a graphswap "
                   f"SavedModel directory (NAME: its name without '_savedmodel')].")
@click.option("-k", "--kernel", default=None,
              help="Kernel for every selected layer: 'exact', 'bf16', 'fp32_m{m}', a built-in "
                   "multiplier (see 'graphswap kernels'), a .c/.lut/.bin multiplier file, "
                   "'lib.so:symbol', or an operation-level .so.  [default: exact, or none when "
                   "--kernel-map is given]")
@click.option("--kernel-map", metavar="MAP.json[#INDEX]",
              help='JSON {"layer name or glob": "kernel spec" or null}, e.g. written by '
                   "'graphswap sweep'; or FRONT.json#INDEX, one point of the front "
                   "'graphswap explore' writes.  Overrides --kernel for the layers it names.")
@click.option("--include", multiple=True, metavar="REGEX",
              help="Swap only layers whose name/path matches (repeatable).")
@click.option("--exclude", multiple=True, metavar="REGEX",
              help="Do not swap layers whose name/path matches (repeatable).")
@layer_types_option("swap")
@click.option("--backward", type=click.Choice(list(BACKWARD_MODES)), default="native",
              show_default=True,
              help="'native': TensorFlow's exact gradients (straight-through); 'kernel': backward "
                   "products through the kernel too; 'lut_grad': the multiplier table's own "
                   "partial derivatives (approximation-aware; Dense and Conv2D).")
@click.option("--check-batch", default=8, show_default=True,
              type=click.IntRange(min=0, max=MAX_CHECK_BATCH),
              help="How many inputs the outputs are compared with the original's on: the first "
                   "calibration examples with --calibrate, else a random batch (0: skip; "
                   f"at most {MAX_CHECK_BATCH}).")
@sequence_length_option("in the random check batch and the MAC count",
                        f"the calibration data's with --calibrate, else {DEFAULT_SEQUENCE_LENGTH}")
@click.option("-f", "--force", is_flag=True, help="Overwrite the output if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@quantization_options
@model_loading_options
@click.pass_context
def convert(ctx, model_path, output, kernel, kernel_map, include, exclude, layer_types, backward,
            check_batch, sequence_length, force, as_json, custom_objects, unsafe, rewrite):
    """Rewrite MODEL so its layers with weights run KERNEL; save it and report.

    MODEL: .keras, full-model .h5, a graphswap SavedModel directory or a Keras 2 SavedModel.
    Swapped by default: Dense, Conv2D, DepthwiseConv2D, SeparableConv2D, Conv1D,
    Conv2DTranspose, EinsumDense and MultiHeadAttention (its projections).  Layers that are
    already swapped get the new kernel when selected and keep theirs otherwise.  The report
    gives, per layer type, the multiply-accumulates per sample that run on the kernel and
    those that stay float.  A subclassed model (class Net(keras.Model)) is converted when
    its class is registered and has get_config (pass its module with --custom-objects).

    With --calibrate DATA the multiplier layers get static activation ranges (saved in the
    model: a prediction no longer depends on its batch); --bias-correction and --recalibrate-bn
    add the zero-gradient-step recovery on the same data (docs/RECOVERY.md).
    """
    source = model_path
    if rewrite["calibrate"] is not None:   # the data is read for the model: load it first
        output = output or io.default_output_path(model_path, "convert")
        io.check_model_output_path(output, force, inputs=[model_path])
        source = _load(model_path, custom_objects, unsafe)
    options = _rewrite_options(rewrite, source if source is not model_path else None, ctx)
    recorded = _record_named_kernels([kernel])   # before the work: nothing written if it fails
    result = io.convert(source, kernel, kernel_map=kernel_map, include=list(include) or None,
                        exclude=list(exclude) or None,
                        layer_types=layer_types, backward=backward,
                        check_batch=check_batch, output=output, force=force,
                        custom_objects=custom_objects, safe_mode=not unsafe,
                        rewrite_options=options, sequence_length=sequence_length)
    _say_recorded(recorded, err=as_json)
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.format_text())


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("-k", "--kernel", default="exact", show_default=True,
              help="Kernel to plan with (affects only the kernel column).")
@click.option("--include", multiple=True, metavar="REGEX", help="As for convert.")
@click.option("--exclude", multiple=True, metavar="REGEX", help="As for convert.")
@layer_types_option("plan for")
@sequence_length_option("in the MAC count")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@model_loading_options
def inspect(model_path, kernel, include, exclude, layer_types, sequence_length, as_json,
            custom_objects, unsafe):
    """List MODEL's layers and what `convert` would swap (nothing is written)."""
    model = _load(model_path, custom_objects, unsafe)
    with swap.counting_length(sequence_length):
        report = swap.plan(model, kernel=kernel, include=list(include) or None,
                           exclude=list(exclude) or None, layer_types=layer_types)
    if as_json:
        click.echo(report.to_json())
    else:
        click.echo(f"model {model.name!r}: inputs {[tuple(t.shape) for t in model.inputs]}, "
                   f"outputs {[tuple(t.shape) for t in model.outputs]}, "
                   f"{model.count_params():,} parameters")
        click.echo(report.format_table())


@main.group("kernels", cls=ReportingGroup, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
def kernels_group(ctx, as_json):
    """List the built-in kernels (or use a subcommand: check)."""
    if ctx.invoked_subcommand is not None:
        return
    listing = kernels.available_kernels()
    if as_json:
        click.echo(json.dumps(listing, indent=2))
        return
    width = max(len(name) for name in listing)
    for name, description in listing.items():
        click.echo(f"{name:<{width}}  {description}")
    click.echo("\nAlso accepted: a multiplier in C (.c, EvoApproxLib style), 'lib.so:symbol', a "
               "256x256 table (.lut, TFApprox .bin), an operation-level library (.so).")


@main.command("export")
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--format", "export_format", type=click.Choice(["onnx", "savedmodel"]),
              default="onnx", show_default=True, help="What to write.")
@click.option("--keep-kernels", is_flag=True,
              help="ONNX only: keep the swapped layers' C kernels as custom nodes "
                   "(ai.onnx.contrib GraphswapMatMul/GraphswapConv2D) that onnxruntime runs "
                   "through onnxruntime-extensions; open with graphswap.onnx_ops.session(path).")
@click.option("-o", "--output", type=click.Path(),
              help="Output file (onnx) or directory (savedmodel) [default: MODEL's name + .onnx, "
                   ".kept.onnx or _savedmodel].")
@click.option("--opset", default=17, show_default=True, help="ONNX opset.")
@click.option("--check-batch", default=8, show_default=True,
              type=click.IntRange(min=1, max=MAX_CHECK_BATCH),
              help="Size of the random batch the export is verified on (1 to "
                   f"{MAX_CHECK_BATCH}).")
@sequence_length_option("in the random batch the export is verified on")
@click.option("-f", "--force", is_flag=True, help="Overwrite the output if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@model_loading_options
def export_command(model_path, export_format, keep_kernels, output, opset, check_batch,
                   sequence_length, force, as_json, custom_objects, unsafe):
    """Export MODEL (.keras, .h5, SavedModel directory) to ONNX or a graphswap SavedModel.

    \b
    onnx (default): swapped layers lowered to standard MatMul/Conv with the fine-tuned
      weights, i.e. the model with the EXACT kernel; the kernel each layer was trained
      for is recorded in metadata_props["graphswap"] (JSON).
    onnx --keep-kernels: swapped products become custom nodes running the same C
      kernels in onnxruntime (needs graphswap + onnxruntime-extensions to run).
    savedmodel: serving_default signature with named inputs/outputs; only standard
      TensorFlow ops, so it serves without graphswap (TF Serving, a fresh Python).
      The approximate arithmetic does NOT run in it (a tf.numpy_function body is not
      serialized): swapped layers run as exact float32 MatMul/Conv2D.  Kernel metadata
      is in assets/graphswap_kernels.json.  --keep-kernels is refused, and so is any
      model that would still contain Python ops.  The directory also holds the
      rewritten model itself (assets/graphswap/model.keras + manifest.json), so every
      graphswap command reopens it: finetune, evaluate, convert, export, ...

    Every export is run on a sample batch and compared with the Keras model before it
    is written (see docs/EXPORT.md).
    """
    if keep_kernels and export_format != "onnx":
        raise click.UsageError(
            "--keep-kernels needs --format onnx: a SavedModel cannot hold the C kernels (a "
            "tf.numpy_function body is not serialized), so it could not serve")
    if output is None:
        kind = export_format if export_format == "savedmodel" else (
            "onnx-kept-kernels" if keep_kernels else "onnx")
        output = io.default_output_path(model_path, kind)
    io.check_output_path(output, force, inputs=[model_path])
    model = _load(model_path, custom_objects, unsafe)
    result = io.export_model(model, output, format=export_format, keep_kernels=keep_kernels,
                             opset=opset, force=force, check_batch=check_batch,
                             sequence_length=sequence_length)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    for layer in result.layers:
        nodes = f" -> {', '.join(layer.onnx_nodes)}" if layer.onnx_nodes else ""
        click.echo(f"{layer.path:<24} {layer.layer_type:<7} kernel {layer.kernel.get('spec')}"
                   f"{nodes}")
    click.echo(f"{len(result.layers)} swapped layer(s); inputs {result.inputs}, outputs "
               f"{result.outputs}")
    free = f" (free dimensions at length {sequence_length or DEFAULT_SEQUENCE_LENGTH})" \
        if swap.has_free_dimensions(model) else ""
    click.echo(f"verified against the {result.reference}: max |difference| "
               f"{result.max_abs_difference:.3g} on a batch of {check_batch}{free}")
    what = result.format
    if result.format == "savedmodel":
        what += ": serves without graphswap; graphswap commands reopen it"
    click.echo(f"wrote {result.path} ({what})")


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.argument("image_path", metavar="IMAGE", type=click.Path())
@click.option("-o", "--output", required=True, type=OutputFile((".png",)),
              help="PNG to write: the input and its saliency heat map side by side.")
@click.option("--class", "class_index", type=int, default=None,
              help="Class whose score is differentiated [default: the predicted class].")
@click.option("--method", type=click.Choice(["guided", "vanilla"]), default="guided",
              show_default=True,
              help="'guided': guided backprop (ReLUs pass positive gradients of active units); "
                   "'vanilla': the plain gradient of the class score.")
@click.option("--index", type=int, default=None,
              help="Sample to use when IMAGE is an .npz archive.")
@click.option("--key", default=None,
              help="Array of the .npz to take the sample from [default: x_test, x, images or "
                   "x_train, whichever is present].")
@click.option("-f", "--force", is_flag=True, help="Overwrite the output if it exists.")
@model_loading_options
def saliency(model_path, image_path, output, class_index, method, index, key, force,
             custom_objects, unsafe):
    """Saliency map of MODEL for IMAGE (a PNG/JPEG, or an .npz with --index), written as a PNG.

    An image file is converted to the model's channels and resized to its input size.
    """
    io.check_output_path(output, force, inputs=[model_path, image_path])
    model = _load(model_path, custom_objects, unsafe)
    image, label, notes = research.load_sample(model, image_path, index=index, key=key)
    for note in notes:
        click.echo(note)
    result = research.saliency_map(model, image, class_index=class_index, method=method)
    probability = float(result.probabilities[result.class_index])
    click.echo(f"predicted class {result.predicted}"
               + (f" (label {label})" if label is not None else "")
               + f"; {method} saliency of class {result.class_index} (p={probability:.3f}, "
                 f"gradient of its {result.score})")
    research.write_saliency_png(result, output, force=force,
                                title=f"{Path(model_path).name}: {Path(image_path).name}"
                                      + (f"[{index}]" if index is not None else ""))
    click.echo(f"wrote {output}")


def _data_options(command):
    """--split, --resize/--pad and --scale, shared by finetune, evaluate and sweep."""
    command = click.option(
        "--scale", default=None, metavar="FACTOR",
        help="Multiply inputs by FACTOR (e.g. 1/255) - only for models without their own "
             "Rescaling layer.")(command)
    command = click.option(
        "--pad", is_flag=True,
        help="Zero-pad (centred) smaller images to the model's input size.")(command)
    command = click.option(
        "--resize", is_flag=True,
        help="Resize images of another size to the model's input size (bilinear).")(command)
    return command


def _task_options(metrics_option="--metrics"):
    """--loss and --metrics (explore: --task-metrics): override the task the saved loss implies
    (graphswap.research.task), shared by finetune, evaluate, sweep and explore."""
    def decorate(command):
        command = click.option(
            metrics_option, "task_metrics", default=None, metavar="NAME[,NAME...]",
            help="Metrics to report (and compile with): accuracy, top5_accuracy, agreement, "
                 "loss, mse, mae, psnr, r2, max_abs_diff; the first is the score compared "
                 "[default: the task's: accuracy for classifiers, r2 for regression].")(command)
        return click.option(
            "--loss", default=None, metavar="NAME",
            help="The loss that decides the task, instead of the one saved with the model: "
                 "sparse_categorical_crossentropy, categorical_crossentropy, "
                 "binary_crossentropy, mse, mae, huber, ...")(command)
    return decorate


def _echo_notes(notes, err=False):
    for note in notes:
        click.echo(f"  {note}", err=err)


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--data", "data_path", required=True, type=click.Path(),
              help="Training data: .npz (x_train/y_train, else x/y) or an image directory with "
                   "one folder per class.")
@click.option("--val-data", type=click.Path(),
              help="Validation data (.npz: x_test/y_test, else x/y; or an image directory).")
@click.option("--val-split", type=float, default=None,
              help="Hold out this fraction of --data (seeded) for validation instead.")
@click.option("--epochs", default=3, show_default=True, type=click.IntRange(min=0),
              help="Total number of epochs (0: only --recalibrate-bn).")
@click.option("--batch-size", default=DEFAULT_BATCH_SIZE, show_default=True)
@click.option("--lr", "learning_rate", default=DEFAULT_LEARNING_RATE, show_default=True,
              type=LEARNING_RATE,
              help="Adam learning rate (the start of the schedule; 0 to 10), or 'auto': 1e-4 "
                   "when the model's training loss at the start shows it still fits its data, "
                   "3e-4 when it is within 4x the original float model's, else 1e-3.")
@click.option("--schedule", type=click.Choice(list(SCHEDULES)),
              default=DEFAULT_SCHEDULE, show_default=True,
              help="Learning rate over the run: decayed to 0 by a cosine, or constant (the "
                   "default recipe was chosen from measurements: docs/RECOVERY.md).")
@click.option("--recalibrate-bn/--no-recalibrate-bn", default=None,
              help="Re-estimate BatchNormalization statistics with the approximate forward (no "
                   "gradient steps) before and after training [default: after training, for "
                   "models with BatchNormalization].")
@click.option("--strategy", type=click.Choice(["none", "mirrored", "multiworker"]),
              default="none", show_default=True,
              help="'mirrored': all local GPUs (or logical CPUs); 'multiworker': the cluster in "
                   "TF_CONFIG (run the same command on every worker).")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False),
              help="Write last/best checkpoints and state here after every epoch (graphswap's "
                   "own folder: the model, data and -o must lie outside it).")
@click.option("--resume", is_flag=True,
              help="Continue the run checkpointed in --checkpoint-dir (weights, optimizer, epoch).")
@click.option("--patience", type=int, default=None,
              help="Stop after this many epochs without improvement of the monitor.")
@click.option("--monitor", default=None,
              help="Metric choosing the best epoch [default: val accuracy, else val_loss].")
@click.option("--seed", default=0, show_default=True, help="Seed for weights, shuffling, splits.")
@click.option("--teacher", default=None, metavar="original|MODEL",
              help="Fine-tune by distillation, without labels: reproduce the outputs of "
                   "'original' (the float model MODEL was made from: its swapped layers "
                   "lowered to exact arithmetic) or of another model file, on --data's inputs.")
@click.option("--teacher-weight", type=click.FloatRange(0, 1, min_open=True), default=1.0,
              show_default=True,
              help="With --teacher: the weight of the teacher's outputs in the targets; below 1 "
                   "they are mixed with the labels (W x teacher + (1 - W) x labels).")
@_task_options()
@_data_options
@click.option("-o", "--output", type=ModelOutput(),
              help=f"Where to write the fine-tuned model: {MODEL_OUTPUT_HELP} [default: MODEL's "
                   f"name + .ft.keras; NAME_ft_savedmodel/ when MODEL is a graphswap SavedModel "
                   f"directory (NAME: its name without '_savedmodel')].")
@click.option("-f", "--force", is_flag=True,
              help="Overwrite the output (and restart an existing checkpoint directory).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@model_loading_options
def finetune(model_path, data_path, val_data, val_split, epochs, batch_size, learning_rate,
             schedule, recalibrate_bn, strategy, checkpoint_dir, resume, patience, monitor, seed,
             scale, pad, resize, output, force, as_json, custom_objects, unsafe, loss=None,
             task_metrics=None, teacher=None, teacher_weight=1.0):
    """Fine-tune MODEL (e.g. written by convert) with its kernels in the loop; save the result.

    Uses the loss/metrics saved with the model (else a stated classifier default), keeps the
    best epoch by the validation metric, and saves atomically.  MODEL may be a graphswap
    SavedModel directory (written by 'export --format savedmodel'); the output then is one
    too by default, serving the fine-tuned weights.
    """
    if output is None:
        output = io.default_output_path(model_path, "finetune",
                                        directory=io.is_graphswap_saved_model(model_path))
    result = research.finetune(
        model_path, data_path, val_data=val_data, val_split=val_split, epochs=epochs,
        batch_size=batch_size, learning_rate=learning_rate, schedule=schedule,
        recalibrate_bn=recalibrate_bn, strategy=strategy,
        checkpoint_dir=checkpoint_dir, resume=resume, patience=patience, monitor=monitor,
        seed=seed, verbose=2 if as_json or not sys.stdout.isatty() else 1,
        resize=resize, pad=pad, scale=scale, custom_objects=custom_objects,
        safe_mode=not unsafe, force=force, output=output,
        log=None if as_json else (lambda note: click.echo(f"  {note}")), loss=loss,
        metrics=task_metrics, teacher=teacher, teacher_weight=teacher_weight)
    if not result.chief:  # a non-chief worker of a multi-worker run: the chief saves
        click.echo(f"worker done (epochs {result.epochs_run}); the chief writes {output}")
        return
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(research.format_history(result))
    if result.best_epoch is not None:
        click.echo(f"best epoch {result.best_epoch} by {result.monitor} "
                   f"({result.best_value:.4f}; marked *; the history is of the training run)")
    final = research.format_final(result)
    if final:
        click.echo(final)
    click.echo(f"wrote {output}")


@main.command("evaluate")
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--data", "data_path", required=True, type=click.Path(),
              help="Evaluation data: .npz (x_test/y_test, else x/y) or an image directory.")
@click.option("-k", "--kernel", "kernel_specs", multiple=True,
              help="Kernel to compare (repeatable) [default: exact, or none for a model that "
                   "already has swapped layers].")
@click.option("--finetune-data", type=click.Path(),
              help="Also fine-tune each rewritten copy on this data (.npz: x_train/y_train) and "
                   "report its accuracy afterwards.")
@click.option("--epochs", default=1, show_default=True, help="Fine-tuning epochs.")
@click.option("--batch-size", default=128, show_default=True)
@click.option("--lr", "learning_rate", default=DEFAULT_LEARNING_RATE, show_default=True,
              type=LEARNING_RATE,
              help="Fine-tuning learning rate, or 'auto' (the default recipe's: Adam, cosine "
                   "decay; as for finetune).")
@click.option("--seed", default=0, show_default=True)
@click.option("--include", multiple=True, metavar="REGEX", help="As for convert.")
@click.option("--exclude", multiple=True, metavar="REGEX", help="As for convert.")
@_task_options()
@_data_options
@click.option("-o", "--output", type=OutputFile((".json", ".csv")),
              help="Write the results as JSON or CSV (by the file's suffix).")
@click.option("--plot", type=OutputFile((".png",)),
              help="Write a bar chart of the accuracies (PNG).")
@click.option("-f", "--force", is_flag=True, help="Overwrite output files.")
@click.option("--json", "json_target", is_flag=False, flag_value="-", default=None,
              metavar="[PATH]",
              help="Print the results as JSON; with a PATH (ending in .json), write them there "
                   "instead (like -o).")
@quantization_options
@model_loading_options
@click.pass_context
def evaluate_command(ctx, model_path, data_path, kernel_specs, finetune_data, epochs, batch_size,
                     learning_rate, seed, include, exclude, scale, pad, resize, output, plot,
                     force, json_target, custom_objects, unsafe, rewrite, loss=None,
                     task_metrics=None):
    """Evaluate MODEL and one rewritten copy per --kernel on the same data, side by side."""
    as_json = json_target == "-"
    if json_target not in (None, "-"):
        if output is not None and output != json_target:
            raise OutputPathError(f"--json {json_target} and -o {output} name two outputs; "
                                  f"use one")
        if Path(json_target).suffix.lower() != ".json":
            raise OutputPathError(f"--json {json_target} must end in .json")
        output = json_target
    for path in (output, plot):
        if path is not None:
            io.check_output_path(path, force, inputs=[model_path, data_path])
    recorded = _record_named_kernels(kernel_specs)   # before the work (see convert)
    result = research.evaluate(model_path, data_path, list(kernel_specs) or None,
                               finetune_data=finetune_data, epochs=epochs, batch_size=batch_size,
                               learning_rate=learning_rate, seed=seed,
                               include=list(include) or None, exclude=list(exclude) or None,
                               resize=resize, pad=pad, scale=scale,
                               custom_objects=custom_objects, safe_mode=not unsafe,
                               rewrite_options=_rewrite_options(rewrite, ctx=ctx), loss=loss,
                               metrics=task_metrics)
    if output is not None:
        result.write(output, force=force)
    if plot is not None:
        result.plot(plot, force=force)
    _say_recorded(recorded, err=as_json)
    if as_json:
        click.echo(result.to_json())
        return
    _echo_notes(result.notes)
    click.echo(result.format_table())
    for path in (output, plot):
        if path is not None:
            click.echo(f"wrote {path}")


@main.command("sweep")
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--data", "data_path", required=True, type=click.Path(),
              help="Evaluation data: .npz (x_test/y_test, else x/y) or an image directory.")
@click.option("-k", "--kernel", "kernel_spec", required=True,
              help="The (approximate) kernel to place layer by layer.")
@click.option("--power", "power_options", multiple=True, metavar="[SPEC=]MW",
              help="Multiplier power in mW when the kernel's source carries no PDK45_PWR "
                   "(repeatable; a bare number applies to --kernel).")
@click.option("--reference-power", type=float, default=None, metavar="MW",
              help="Power of the exact multiplier [default: 0.391 mW, EvoApproxLib mul8u_1JFF; "
                   "0.425 mW, mul8s_1KV6, for signed multipliers].")
@click.option("--max-drop", default=1.0, show_default=True, metavar="POINTS",
              type=click.FloatRange(0, 100),
              help="Accuracy budget in percentage points (0..100) for the written kernel map.")
@click.option("--include", multiple=True, metavar="REGEX", help="As for convert.")
@click.option("--exclude", multiple=True, metavar="REGEX", help="As for convert.")
@layer_types_option("sweep")
@click.option("--batch-size", default=128, show_default=True,
              help="Evaluation batch size (as evaluate's, so the numbers compare).")
@_task_options()
@_data_options
@click.option("-o", "--output", type=OutputFile((".json",)),
              help="Where to write the kernel map for 'convert --kernel-map' "
                   "[default: MODEL's name + .kernel_map.json].")
@click.option("--plot", type=OutputFile((".png",)),
              help="Write the Pareto plot (accuracy vs relative multiply energy) as PNG.")
@click.option("-f", "--force", is_flag=True, help="Overwrite output files.")
@click.option("--json", "as_json", is_flag=True, help="Print the full sweep as JSON.")
@quantization_options
@model_loading_options
@click.pass_context
def sweep_command(ctx, model_path, data_path, kernel_spec, power_options, reference_power,
                  max_drop, include, exclude, layer_types, batch_size, scale, pad, resize, output,
                  plot, force, as_json, custom_objects, unsafe, rewrite, loss=None,
                  task_metrics=None):
    """Swap one layer at a time to KERNEL: accuracy drop, MACs, energy, Pareto plot, kernel map.

    On a terminal a progress bar (click's) on stderr counts the evaluated models: one per
    layer, then one per cumulative step.
    """
    if output is None:
        output = io.default_output_path(model_path, "sweep")
    for path in (output, plot):
        if path is not None:
            io.check_output_path(path, force, inputs=[model_path, data_path])
    # a bar only where someone watches it: not in logs, pipes or --json output
    progress = SweepProgress(enabled=not as_json and sys.stderr.isatty())
    recorded = _record_named_kernels([kernel_spec])   # before the work (see convert)
    try:
        result = research.sweep(model_path, data_path, kernel_spec,
                                power=research.parse_power_options(power_options) or None,
                                reference_power=reference_power,
                                max_accuracy_drop=max_drop / 100.0,
                                layer_types=layer_types,
                                include=list(include) or None, exclude=list(exclude) or None,
                                batch_size=batch_size, resize=resize, pad=pad, scale=scale,
                                custom_objects=custom_objects, safe_mode=not unsafe,
                                progress=progress,
                                rewrite_options=_rewrite_options(rewrite, ctx=ctx), loss=loss,
                                metrics=task_metrics)
    finally:
        progress.close()
    result.write_kernel_map(output, force=force)
    if plot is not None:
        result.plot(plot, force=force)
    _say_recorded(recorded, err=as_json)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "output": str(output), "plot": plot},
                              indent=2))
        return
    _echo_notes(result.notes)
    click.echo(result.format_table())
    click.echo(f"wrote {output} (graphswap convert {model_path} --kernel-map {output})")
    if plot is not None:
        click.echo(f"wrote {plot}")


@main.command("explore")
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--data", "data_path", required=True, type=click.Path(),
              help="Validation data: .npz (x_test/y_test, else x/y) or an image directory.")
@click.option("--library", "library_sources", multiple=True, required=True,
              metavar="DIR|FILE|SPEC",
              help="Circuits to choose from (repeatable): a directory of multiplier files "
                   "(.c, .lut, .bin), files, 'lib.so:symbol' specs or built-in names.")
@click.option("--metrics", "metrics_table", type=click.Path(dir_okay=False),
              help="CSV (name,power,area,delay) or JSON table of hardware figures; overrides "
                   "the files' PDK45_* headers; a row 'exact' gives the exact multiplier's.")
@click.option("--budget", default=1.0, show_default=True, type=click.FloatRange(min=0),
              metavar="POINTS", help="Score drop allowed against the float model, in points "
                                     "(hundredths: of accuracy, R^2; for a lower-is-better "
                                     "score such as mse, 1.0 allows an increase of 0.01).")
@click.option("--objective", type=click.Choice(["power", "area", "delay"]), default="power",
              show_default=True, help="Hardware figure to minimise (MAC-weighted).")
@click.option("--trials", type=click.IntRange(min=1), default=None,
              help="Assignments the NSGA-II search measures in all [default: 20 x layers]; "
                   "a space of at most --exhaustive-limit assignments is enumerated instead.")
@click.option("--exhaustive-limit", default=256, show_default=True, type=click.IntRange(min=0),
              help="Enumerate every assignment when there are at most this many.")
@click.option("--estimate-samples", default=512, show_default=True,
              type=click.IntRange(min=1),
              help="Validation examples for the per-(layer, circuit) estimates.")
@click.option("--finetune-data", type=click.Path(),
              help="Fine-tune the cheapest front points within the budget on this data "
                   "(.npz: x_train/y_train) and measure them again.")
@click.option("--finetune-epochs", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--finetune-points", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--study", metavar="FILE|URL",
              help="Study database keeping every measurement: a SQLite file, or an optuna "
                   "storage URL (sqlite:///PATH, postgresql://..., mysql://...) that several "
                   "explore workers share. An interrupted exploration resumes, a finished one "
                   "answers a new --budget without re-measuring.")
@click.option("--claim-timeout", default=60.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="With several workers on one --study: take over the assignments a worker "
                   "claimed once it has sent no heartbeat for this long (it was killed).")
@click.option("--include", multiple=True, metavar="REGEX", help="As for convert.")
@click.option("--exclude", multiple=True, metavar="REGEX", help="As for convert.")
@click.option("--batch-size", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True)
@_task_options("--task-metrics")
@_data_options
@click.option("-o", "--output", type=OutputFile((".json",)),
              help="Write the front as JSON [default: MODEL's name + .front.json]; each point's "
                   "kernel map converts with 'graphswap convert MODEL --kernel-map FRONT#INDEX'.")
@click.option("--plot", type=OutputFile((".png",)),
              help="Write accuracy against relative cost (front, references, budget) as PNG.")
@click.option("-f", "--force", is_flag=True, help="Overwrite output files.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@quantization_options
@model_loading_options
@click.pass_context
def explore_command(ctx, model_path, data_path, library_sources, metrics_table, budget,
                    objective, trials, exhaustive_limit, estimate_samples, finetune_data,
                    finetune_epochs, finetune_points, study, claim_timeout, include, exclude,
                    batch_size, seed, scale, pad, resize, output, plot, force, as_json,
                    custom_objects, unsafe, rewrite, loss=None, task_metrics=None):
    """Choose a multiplier per layer from a library of circuits: the measured Pareto front of
    accuracy against hardware cost, the cheapest assignment within the budget, and (with
    --finetune-data) how far retraining recovers it.

    With --calibrate DATA (and the other zero-training options, as convert has them) every
    assignment is measured as 'convert --kernel-map FRONT#INDEX' with the same options builds
    it; the front file records them.  Several workers may share one --study.
    """
    rewrite_options = _rewrite_options(rewrite, ctx=ctx)
    if output is None:
        output = io.default_output_path(model_path, "explore")
    for path in (output, plot):
        if path is not None:
            io.check_output_path(path, force, inputs=[model_path, data_path])
    result = research.explore(
        model_path, data_path, list(library_sources), budget=budget / 100.0,
        objective=objective, metrics=metrics_table, trials=trials,
        exhaustive_limit=exhaustive_limit, estimate_samples=estimate_samples,
        finetune_data=finetune_data, finetune_epochs=finetune_epochs,
        finetune_points=finetune_points, study=study, include=list(include) or None,
        exclude=list(exclude) or None, batch_size=batch_size, seed=seed, resize=resize,
        pad=pad, scale=scale, custom_objects=custom_objects, safe_mode=not unsafe,
        progress=not as_json and sys.stderr.isatty(),
        log=None if as_json else (lambda note: click.echo(f"  {note}")), loss=loss,
        task_metrics=task_metrics, rewrite_options=rewrite_options,
        claim_timeout=claim_timeout)
    result.write(output, force=force)
    if plot is not None:
        result.plot(plot, force=force)
    # the circuits are known only now: a store that cannot be written is said with the front
    _say_recorded([c.spec for c in result.library.circuits], err=as_json, written=output)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "output": str(output), "plot": plot},
                              indent=2))
        return
    click.echo(result.format_table())
    flags = "".join(f" {shlex.quote(flag)}" for flag in result.convert_options)
    click.echo(f"wrote {output} (graphswap convert {model_path} --kernel-map {output}#INDEX"
               f"{flags})")
    if plot is not None:
        click.echo(f"wrote {plot}")


@main.group("trust", cls=ReportingGroup)
def trust_group():
    """Approve native kernel files once: a model, kernel map or ONNX file that names a kernel
    file loads it only if you trust that file's content (its SHA-256).

    \b
      graphswap trust add mymul.c       remember it (until its content changes)
      graphswap trust list              what is remembered
      graphswap trust remove mymul.c    forget it (or give its sha256)

    Naming a kernel file yourself on the command line (convert/evaluate/sweep --kernel FILE)
    adds it too, and says so.  The store is a file in your config directory, owner-only.
    """


@trust_group.command("add")
@click.argument("paths", metavar="FILE...", nargs=-1, required=True,
                type=click.Path(dir_okay=False))
def trust_add(paths):
    """Trust the current content of each kernel FILE (.c, .so), for later sessions too."""
    for path in paths:
        digest = trust_store.trust(path, persist=True)
        click.echo(f"trusted {trust_store.shown(os.path.realpath(path))} (sha256 {digest})")
    click.echo(f"trust store: {trust_store.store_path()}")


@trust_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def trust_list(as_json):
    """List the trusted kernel files (path, SHA-256, when added, and whether the file still
    has that content)."""
    entries = trust_store.stored_trust()
    for entry in entries:
        entry["current"] = _file_state(entry)
    if as_json:
        click.echo(json.dumps({"store": str(trust_store.store_path()), "kernels": entries},
                              indent=2))
        return
    if not entries:
        click.echo(f"no trusted kernel files (store: {trust_store.store_path()})")
        return
    rows = [(trust_store.shown(e["path"]), e["sha256"][:16] + "...", trust_store.shown(e["added"]),
             e["current"]) for e in entries]
    click.echo("\n".join(format_table(("path", "sha256", "added", "file now"), rows)))
    click.echo(f"store: {trust_store.store_path()}")


def _file_state(entry) -> str:
    state = trust_store.file_state(entry)
    return {"same": "same content", "changed": "changed (not trusted)", "missing": "missing",
            "reads other files": "same content, but refused: it includes headers from outside "
                                 "the system's, or its library fails graphswap's allowlist "
                                 "('graphswap trust add FILE' says why)"}[state]


@trust_group.command("remove")
@click.argument("keys", metavar="FILE|SHA256...", nargs=-1, required=True)
def trust_remove(keys):
    """Stop trusting a kernel file (every recorded content of that path) or one SHA-256."""
    for key in keys:
        removed = trust_store.untrust(key)
        if not removed:
            raise KernelTrustError(f"{key} is not in the trust store "
                                   f"({trust_store.store_path()}); see 'graphswap trust list'")
        for entry in removed:
            click.echo(f"no longer trusted: {trust_store.shown(entry['path'])} "
                       f"(sha256 {entry['sha256']})")


@kernels_group.command("check")
@click.argument("spec")
@click.option("--plot", type=OutputFile((".png",)),
              help="Write an error heat map (approx - exact over all operand pairs) as PNG.")
@click.option("--timeout", default=120.0, show_default=True,
              help="Seconds before a hanging kernel is killed and reported.")
@click.option("-f", "--force", is_flag=True, help="Overwrite the --plot file if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def kernels_check(spec, plot, timeout, force, as_json):
    """Check a kernel: sanity checks and error metrics of a multiplier (with its header's values
    beside them), determinism, re-entrancy, guard regions and NaN/Inf behaviour.

    The kernel runs in a child process: a segfault, abort or hang is reported as a failed check.
    Exit code 1 when a check fails; warnings (a property some published circuits have, such as
    f(0, 0) != 0) do not fail it.
    """
    if plot:
        io.check_output_path(plot, force)
    result = kernels.check_kernel(spec, plot=plot, timeout=timeout)
    click.echo(json.dumps(result, indent=2, default=float) if as_json
               else kernels.format_check_result(result))
    if plot and result.get("plot"):
        click.echo(f"wrote {plot}")
    if not result["passed"]:
        sys.exit(EXIT_ERROR)


if __name__ == "__main__":  # pragma: no cover
    main()
