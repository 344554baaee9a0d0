"""`graphswap evaluate`: a model and one rewritten copy per kernel, evaluated side by side."""

from __future__ import annotations

from pathlib import Path

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.help import SectionedCommand
from graphswap.cli.options import (LEARNING_RATE, OutputFile, data_option, data_options,
                                   force_option, model_loading_options, more_option,
                                   plot_option, quantization_options, selection_options,
                                   task_options)
from graphswap.cli.running import echo_notes, record_named_kernels, rewrite_options, \
    say_recorded
from graphswap.cli.values import DEFAULT_LEARNING_RATE
from graphswap.errors import OutputPathError


@click.command("evaluate", cls=SectionedCommand)
@click.argument("model_path", metavar="MODEL", type=click.Path())
@data_option("evaluation")
@click.option("-k", "--kernel", "kernel_specs", multiple=True,
              help="Kernel to compare (repeatable) [default: exact, or none for a model that "
                   "already has swapped layers].")
@click.option("--finetune-data", type=click.Path(),
              help="Also fine-tune each rewritten copy on this data (.npz: x_train/y_train) and "
                   "report its accuracy afterwards.")
@click.option("--epochs", default=1, show_default=True, help="Fine-tuning epochs.")
@more_option("--batch-size", default=128, show_default=True)
@more_option("--lr", "learning_rate", default=DEFAULT_LEARNING_RATE, show_default=True,
             type=LEARNING_RATE,
             help="Fine-tuning learning rate, or 'auto' (the default recipe's: Adam, cosine "
                  "decay; as for finetune).")
@more_option("--seed", default=0, show_default=True)
@selection_options()
@task_options()
@data_options
@click.option("-o", "--output", type=OutputFile((".json", ".csv")),
              help="Write the results as JSON or CSV (by the file's suffix).")
@plot_option("a bar chart of the accuracies")
@force_option("output files")
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
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import io, research
    for path in (output, plot):
        if path is not None:
            io.check_output_path(path, force, inputs=[model_path, data_path])
    recorded = record_named_kernels(kernel_specs)   # before the work (see convert)
    result = research.evaluate(model_path, data_path, list(kernel_specs) or None,
                               finetune_data=finetune_data, epochs=epochs, batch_size=batch_size,
                               learning_rate=learning_rate, seed=seed,
                               include=list(include) or None, exclude=list(exclude) or None,
                               resize=resize, pad=pad, scale=scale,
                               custom_objects=custom_objects, safe_mode=not unsafe,
                               rewrite_options=rewrite_options(rewrite, ctx=ctx), loss=loss,
                               metrics=task_metrics)
    if output is not None:
        result.write(output, force=force)
    if plot is not None:
        result.plot(plot, force=force)
    say_recorded(recorded, err=as_json)
    if as_json:
        click.echo(result.to_json())
        return
    echo_notes(result.notes)
    click.echo(result.format_table())
    for path in (output, plot):
        if path is not None:
            click.echo(f"wrote {path}")
