"""`graphswap sweep`: one layer at a time swapped to a kernel - accuracy drop, MACs, energy, the
Pareto plot and a kernel map for convert."""

from __future__ import annotations

import json
import sys

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.help import SectionedCommand
from graphswap.cli.options import (OutputFile, data_option, data_options, force_option,
                                   json_option, layer_types_option, model_loading_options,
                                   more_option, plot_option, quantization_options,
                                   selection_options, task_options)
from graphswap.cli.running import echo_notes, record_named_kernels, rewrite_options, \
    say_recorded


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


@click.command("sweep", cls=SectionedCommand)
@click.argument("model_path", metavar="MODEL", type=click.Path())
@data_option("evaluation")
@click.option("-k", "--kernel", "kernel_spec", required=True,
              help="The (approximate) kernel to place layer by layer.")
@more_option("--power", "power_options", multiple=True, metavar="[SPEC=]MW",
             help="Multiplier power in mW when the kernel's source carries no PDK45_PWR "
                  "(repeatable; a bare number applies to --kernel).")
@more_option("--reference-power", type=float, default=None, metavar="MW",
             help="Power of the exact multiplier [default: 0.391 mW, EvoApproxLib mul8u_1JFF; "
                  "0.425 mW, mul8s_1KV6, for signed multipliers].")
@click.option("--max-drop", default=1.0, show_default=True, metavar="POINTS",
              type=click.FloatRange(0, 100),
              help="Accuracy budget in percentage points (0..100) for the written kernel map.")
@selection_options()
@layer_types_option("sweep")
@more_option("--batch-size", default=128, show_default=True,
             help="Evaluation batch size (as evaluate's, so the numbers compare).")
@task_options()
@data_options
@click.option("-o", "--output", type=OutputFile((".json",)),
              help="Where to write the kernel map for 'convert --kernel-map' "
                   "[default: MODEL's name + .kernel_map.json].")
@plot_option("the Pareto plot (accuracy vs relative multiply energy)")
@force_option("output files")
@json_option("the full sweep")
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
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import io, research
    if output is None:
        output = io.default_output_path(model_path, "sweep")
    for path in (output, plot):
        if path is not None:
            io.check_output_path(path, force, inputs=[model_path, data_path])
    # a bar only where someone watches it: not in logs, pipes or --json output
    progress = SweepProgress(enabled=not as_json and sys.stderr.isatty())
    recorded = record_named_kernels([kernel_spec])   # before the work (see convert)
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
                                rewrite_options=rewrite_options(rewrite, ctx=ctx), loss=loss,
                                metrics=task_metrics)
    finally:
        progress.close()
    result.write_kernel_map(output, force=force)
    if plot is not None:
        result.plot(plot, force=force)
    say_recorded(recorded, err=as_json)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "output": str(output), "plot": plot},
                              indent=2))
        return
    echo_notes(result.notes)
    click.echo(result.format_table())
    click.echo(f"wrote {output} (graphswap convert {model_path} --kernel-map {output})")
    if plot is not None:
        click.echo(f"wrote {plot}")
