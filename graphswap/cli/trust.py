"""`graphswap trust`: approve native kernel files once (add, list, remove), in the trust store
graphswap.kernels.trust keeps in the user's config directory."""

from __future__ import annotations

import json
import os

import click

from graphswap.cli.options import json_option
from graphswap.cli.reporting import ReportingGroup
from graphswap.errors import KernelTrustError
from graphswap.tables import format_table


@click.group("trust", cls=ReportingGroup)
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
    from graphswap.kernels import trust as trust_store
    for path in paths:
        digest = trust_store.trust(path, persist=True)
        click.echo(f"trusted {trust_store.shown(os.path.realpath(path))} (sha256 {digest})")
    click.echo(f"trust store: {trust_store.store_path()}")


@trust_group.command("list")
@json_option(None)
def trust_list(as_json):
    """List the trusted kernel files (path, SHA-256, when added, and whether the file still
    has that content)."""
    from graphswap.kernels import trust as trust_store
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
    from graphswap.kernels import trust as trust_store
    state = trust_store.file_state(entry)
    return {"same": "same content", "changed": "changed (not trusted)", "missing": "missing",
            "reads other files": "same content, but refused: it includes headers from outside "
                                 "the system's, or its library fails graphswap's allowlist "
                                 "('graphswap trust add FILE' says why)"}[state]


@trust_group.command("remove")
@click.argument("keys", metavar="FILE|SHA256...", nargs=-1, required=True)
def trust_remove(keys):
    """Stop trusting a kernel file (every recorded content of that path) or one SHA-256."""
    from graphswap.kernels import trust as trust_store
    for key in keys:
        removed = trust_store.untrust(key)
        if not removed:
            raise KernelTrustError(f"{key} is not in the trust store "
                                   f"({trust_store.store_path()}); see 'graphswap trust list'")
        for entry in removed:
            click.echo(f"no longer trusted: {trust_store.shown(entry['path'])} "
                       f"(sha256 {entry['sha256']})")
