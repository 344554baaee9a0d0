"""The `graphswap` command line: thin click commands over the Python API.

Every command parses its options, calls the API, and prints.  Errors graphswap raises on bad input
(GraphswapError) print as one `Error: ...` line with exit code 1; usage errors exit 2 (click's
convention); anything unexpected prints one line too (set GRAPHSWAP_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import click

# TensorFlow's C++ start-up chatter would bury the report; users can still raise it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from graphswap._version import __version__  # noqa: E402  (after the environment tweak)

EXIT_ERROR = 1


def handle_errors(command):
    """Turn exceptions into one clear line and a non-zero exit code."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        from graphswap.errors import GraphswapError

        try:
            return command(*args, **kwargs)
        except click.exceptions.Exit:
            raise
        except click.ClickException:
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
            click.echo(f"Error: unexpected {type(exc).__name__}: {first} "
                       f"(set GRAPHSWAP_DEBUG=1 to see the traceback)", err=True)
            sys.exit(EXIT_ERROR)

    return wrapper


def model_loading_options(command):
    """--custom-objects and --unsafe, shared by the commands that load models."""
    command = click.option(
        "--custom-objects", type=click.Path(dir_okay=False),
        help="Python module whose classes/functions the model needs (custom layers).")(command)
    command = click.option(
        "--unsafe", is_flag=True,
        help="Allow loading Lambda layers (runs Python code stored in the model: only for files "
             "you trust).")(command)
    return command


def _load(path, custom_objects=None, unsafe=False):
    from graphswap import modelio

    return modelio.load_model(path, custom_objects=custom_objects, safe_mode=not unsafe)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="graphswap")
def main():
    """Rewrite Keras models so Dense/Conv2D forward passes run your C arithmetic.

    Typical session:

    \b
      graphswap convert model.keras --kernel mul8u_drum4
      graphswap finetune model.swapped.keras --data train.npz
      graphswap evaluate model.keras --data test.npz --kernel exact --kernel mul8u_drum4
    """


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Where to write the rewritten model [default: MODEL's name + .swapped.keras].")
@click.option("-k", "--kernel", default=None,
              help="Kernel for every selected layer: 'exact', 'bf16', 'fp32_m{m}', a built-in "
                   "multiplier (see 'graphswap kernels'), a .c/.lut/.bin multiplier file, "
                   "'lib.so:symbol', or an operation-level .so.  [default: exact, or none when "
                   "--kernel-map is given]")
@click.option("--kernel-map", type=click.Path(dir_okay=False),
              help='JSON {"layer name or glob": "kernel spec" or null}, e.g. written by '
                   "'graphswap sweep'; overrides --kernel for the layers it names.")
@click.option("--include", multiple=True, metavar="REGEX",
              help="Swap only layers whose name/path matches (repeatable).")
@click.option("--exclude", multiple=True, metavar="REGEX",
              help="Do not swap layers whose name/path matches (repeatable).")
@click.option("--type", "layer_types", multiple=True, type=click.Choice(["Dense", "Conv2D"]),
              help="Layer types to swap (repeatable) [default: both].")
@click.option("--backward", type=click.Choice(["native", "kernel"]), default="native",
              show_default=True,
              help="'native': TensorFlow's exact gradients (straight-through); 'kernel': backward "
                   "products through the kernel too.")
@click.option("--check-batch", default=8, show_default=True,
              help="Size of the random batch used to compare outputs with the original (0: skip).")
@click.option("-f", "--force", is_flag=True, help="Overwrite the output if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@model_loading_options
@handle_errors
def convert(model_path, output, kernel, kernel_map, include, exclude, layer_types, backward,
            check_batch, force, as_json, custom_objects, unsafe):
    """Rewrite MODEL (.keras, .h5) so its Dense/Conv2D layers run KERNEL; save it and report."""
    from graphswap import checks, modelio
    from graphswap.rewrite import rewrite_model

    source = Path(model_path)
    if output is None:
        stem = source.name[: -len(source.suffix)] if source.suffix else source.name
        output = source.with_name(f"{stem}.swapped.keras")
    modelio.check_output_path(output, force, inputs=[source])
    if kernel is None and kernel_map is None:
        kernel = "exact"
    model = _load(source, custom_objects, unsafe)
    swapped, report = rewrite_model(
        model, kernel=kernel, include=list(include) or None, exclude=list(exclude) or None,
        kernel_map=kernel_map, layer_types=tuple(layer_types) or ("Dense", "Conv2D"),
        backward=backward, return_report=True)
    if not report.swapped:
        from graphswap.errors import GraphswapError

        raise GraphswapError(
            f"nothing to swap in {source}: no Dense/Conv2D layer was selected "
            f"({len(report.layers)} layers inspected); see 'graphswap inspect {source}'")
    difference = None
    if check_batch > 0:
        batch = checks.sample_inputs(model, check_batch)
        difference = checks.max_output_difference(model, swapped, batch)
    modelio.save_model(swapped, output, force=force)
    if as_json:
        payload = report.to_dict()
        payload.update({"output": str(output), "max_abs_difference": difference})
        click.echo(json.dumps(payload, indent=2))
        return
    click.echo(report.format_table())
    if difference is not None:
        click.echo(f"max |original - rewritten| on a random batch of {check_batch}: "
                   f"{difference:.3g}")
    click.echo(f"wrote {output}")


@main.command()
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("-k", "--kernel", default="exact", show_default=True,
              help="Kernel to plan with (affects only the kernel column).")
@click.option("--include", multiple=True, metavar="REGEX", help="As for convert.")
@click.option("--exclude", multiple=True, metavar="REGEX", help="As for convert.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@model_loading_options
@handle_errors
def inspect(model_path, kernel, include, exclude, as_json, custom_objects, unsafe):
    """List MODEL's layers and what `convert` would swap (nothing is written)."""
    from graphswap.rewrite import plan

    model = _load(model_path, custom_objects, unsafe)
    report = plan(model, kernel=kernel, include=list(include) or None,
                  exclude=list(exclude) or None)
    if as_json:
        click.echo(report.to_json())
    else:
        click.echo(f"model {model.name!r}: inputs {[tuple(t.shape) for t in model.inputs]}, "
                   f"outputs {[tuple(t.shape) for t in model.outputs]}, "
                   f"{model.count_params():,} parameters")
        click.echo(report.format_table())


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
@handle_errors
def kernels(ctx, as_json):
    """List the built-in kernels (or use a subcommand: check)."""
    if ctx.invoked_subcommand is not None:
        return
    from graphswap.kernels import available_kernels

    listing = available_kernels()
    if as_json:
        click.echo(json.dumps(listing, indent=2))
        return
    width = max(len(name) for name in listing)
    for name, description in listing.items():
        click.echo(f"{name:<{width}}  {description}")
    click.echo("\nAlso accepted: a multiplier in C (.c, EvoApproxLib style), 'lib.so:symbol', a "
               "256x256 table (.lut, TFApprox .bin), an operation-level library (.so).")


if __name__ == "__main__":  # pragma: no cover
    main()
