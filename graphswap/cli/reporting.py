"""What every command shares while it runs: the error reporting - report_errors and ReportingGroup
turn any error into one `Error: ...` line and exit code 1.  (Each command imports the API it calls
inside its body, after import_tensorflow_quietly(): loading the command line imports nothing
heavy, and a reader follows every call to its module.)

Errors graphswap raises on bad input (GraphswapError) print with their message; click's usage
errors (unknown option, bad choice, missing argument) exit 1 too; anything unexpected prints one
line too (set GRAPHSWAP_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import os
import sys

import click

from graphswap.errors import GraphswapError


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
            from graphswap.swap import tensorflow_reason   # TensorFlow raised it: loaded
            first = tensorflow_reason(exc)  # not Keras' "Exception encountered when ..."
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
            from graphswap.kernels.trust import config_dir
            config_dir()  # $GRAPHSWAP_CONFIG_DIR naming a file: refused before work
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
