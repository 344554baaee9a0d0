"""The `graphswap` group: its own options (--version, --compile-c-unsandboxed) and its commands,
one module each."""

from __future__ import annotations

import os

import click

from graphswap._version import __version__
from graphswap.cli.convert import convert
from graphswap.cli.evaluate import evaluate_command
from graphswap.cli.explore import explore_command
from graphswap.cli.export import export_command
from graphswap.cli.finetune import finetune
from graphswap.cli.inspect import inspect
from graphswap.cli.kernels import kernels_group
from graphswap.cli.reporting import ReportingGroup
from graphswap.cli.saliency import saliency
from graphswap.cli.sweep import sweep_command
from graphswap.cli.trust import trust_group

COMMANDS = (convert, inspect, kernels_group, export_command, saliency, finetune, evaluate_command,
            sweep_command, explore_command, trust_group)


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


for command in COMMANDS:
    main.add_command(command)
