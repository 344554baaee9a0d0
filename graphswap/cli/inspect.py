"""`graphswap inspect`: a model's layers and what `convert` would swap (nothing is written)."""

from __future__ import annotations

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.help import SectionedCommand
from graphswap.cli.options import (json_option, layer_types_option, model_loading_options,
                                   selection_options, sequence_length_option)
from graphswap.cli.running import load_model


@click.command("inspect", cls=SectionedCommand)
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("-k", "--kernel", default="exact", show_default=True,
              help="Kernel to plan with (affects only the kernel column).")
@selection_options()
@layer_types_option("plan for")
@sequence_length_option("in the MAC count")
@json_option(None)
@model_loading_options
def inspect(model_path, kernel, include, exclude, layer_types, sequence_length, as_json,
            custom_objects, unsafe):
    """List MODEL's layers and what `convert` would swap (nothing is written)."""
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import swap
    model = load_model(model_path, custom_objects, unsafe)
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
