"""`graphswap explore`: a multiplier chosen per layer from a library of circuits - the measured
Pareto front of accuracy against hardware cost, the cheapest assignment within the budget."""

from __future__ import annotations

import json
import shlex
import sys

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.help import SectionedCommand
from graphswap.cli.options import (OutputFile, data_option, data_options, force_option,
                                   json_option, model_loading_options, more_option, plot_option,
                                   quantization_options, selection_options, task_options)
from graphswap.cli.running import rewrite_options, say_recorded


@click.command("explore", cls=SectionedCommand)
@click.argument("model_path", metavar="MODEL", type=click.Path())
@data_option("validation")
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
@more_option("--exhaustive-limit", default=256, show_default=True, type=click.IntRange(min=0),
             help="Enumerate every assignment when there are at most this many.")
@more_option("--estimate-samples", default=512, show_default=True,
             type=click.IntRange(min=1),
             help="Validation examples for the per-(layer, circuit) estimates.")
@click.option("--finetune-data", type=click.Path(),
              help="Fine-tune the cheapest front points within the budget on this data "
                   "(.npz: x_train/y_train) and measure them again.")
@more_option("--finetune-epochs", default=1, show_default=True, type=click.IntRange(min=1))
@more_option("--finetune-points", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--study", metavar="FILE|URL",
              help="Study database keeping every measurement: a SQLite file, or an optuna "
                   "storage URL (sqlite:///PATH, postgresql://..., mysql://...) that several "
                   "explore workers share. An interrupted exploration resumes, a finished one "
                   "answers a new --budget without re-measuring.")
@more_option("--claim-timeout", default=60.0, show_default=True,
             type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
             help="With several workers on one --study: take over the assignments a worker "
                  "claimed once it has sent no heartbeat for this long (it was killed).")
@selection_options()
@more_option("--batch-size", default=128, show_default=True, type=click.IntRange(min=1))
@more_option("--seed", default=0, show_default=True)
@task_options("--task-metrics")
@data_options
@click.option("-o", "--output", type=OutputFile((".json",)),
              help="Write the front as JSON [default: MODEL's name + .front.json]; each point's "
                   "kernel map converts with 'graphswap convert MODEL --kernel-map FRONT#INDEX'.")
@plot_option("accuracy against relative cost (front, references, budget)")
@force_option("output files")
@json_option()
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
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import io, research
    options = rewrite_options(rewrite, ctx=ctx)
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
        task_metrics=task_metrics, rewrite_options=options,
        claim_timeout=claim_timeout)
    result.write(output, force=force)
    if plot is not None:
        result.plot(plot, force=force)
    # the circuits are known only now: a store that cannot be written is said with the front
    say_recorded([c.spec for c in result.library.circuits], err=as_json, written=output)
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
