"""`graphswap kernels`: the built-in kernels' list, and `kernels check`, a kernel's sanity checks
and error metrics (run in a child process).  No TensorFlow: `graphswap kernels` answers at once.
"""

from __future__ import annotations

import json
import sys

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.options import force_option, json_option, plot_option
from graphswap.cli.reporting import EXIT_ERROR, ReportingGroup


@click.group("kernels", cls=ReportingGroup, invoke_without_command=True)
@json_option(None)
@click.pass_context
def kernels_group(ctx, as_json):
    """List the built-in kernels (or use a subcommand: check)."""
    from graphswap import kernels
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


@kernels_group.command("check")
@click.argument("spec")
@plot_option("an error heat map (approx - exact over all operand pairs)")
@click.option("--timeout", default=120.0, show_default=True,
              help="Seconds before a hanging kernel is killed and reported.")
@force_option("the --plot file if it exists")
@json_option()
def kernels_check(spec, plot, timeout, force, as_json):
    """Check a kernel: sanity checks and error metrics of a multiplier (with its header's values
    beside them), determinism, re-entrancy, guard regions and NaN/Inf behaviour.

    The kernel runs in a child process: a segfault, abort or hang is reported as a failed check.
    Exit code 1 when a check fails; warnings (a property some published circuits have, such as
    f(0, 0) != 0) do not fail it.
    """
    from graphswap import kernels
    if plot:
        import_tensorflow_quietly()   # before the API, which imports it
        from graphswap import io
        io.check_output_path(plot, force)
    result = kernels.check_kernel(spec, plot=plot, timeout=timeout)
    click.echo(json.dumps(result, indent=2, default=float) if as_json
               else kernels.format_check_result(result))
    if plot and result.get("plot"):
        click.echo(f"wrote {plot}")
    if not result["passed"]:
        sys.exit(EXIT_ERROR)
