#!/usr/bin/env python
"""Re-run every command of docs/WALKTHROUGH.md and write its output back, verbatim.

Each fenced block whose first line is `$ graphswap ...` is run from the repository root (outputs
go to runs/, emptied first so every command writes as on a first run, and left in place), with a fresh trust
store so the "trusted ..." lines read as a first run does.  Keras' per-step timing ("12ms/step")
is replaced by "...", and the repository's absolute path by /path/to/graphswap, as the
walk-through's introduction says.

    python docs/update_walkthrough.py            # rewrite docs/WALKTHROUGH.md in place
    python docs/update_walkthrough.py --check    # exit 1 if an output changed (nothing written)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WALKTHROUGH = REPO / "docs" / "WALKTHROUGH.md"
BLOCK = re.compile(r"```\n(\$ graphswap [^\n]*)\n(.*?)```", re.S)
TIMING = re.compile(r" - \d+s - \d+(\.\d+)?(ms|s|us)/step")


def run(command: str, env: dict) -> str:
    args = shlex.split(command[2:])
    result = subprocess.run([sys.executable, "-m", "graphswap.cli", *args[1:]], cwd=REPO,
                            env=env, capture_output=True, text=True)
    text = result.stderr + result.stdout if result.stderr.strip() else result.stdout
    text = TIMING.sub(" - ...s - ...ms/step", text)
    text = text.replace(str(REPO), "/path/to/graphswap")
    if result.returncode != 0:
        text += f"(exit code {result.returncode})\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    shutil.rmtree(REPO / "runs", ignore_errors=True)
    (REPO / "runs").mkdir()
    env = dict(os.environ, GRAPHSWAP_CONFIG_DIR=tempfile.mkdtemp(), TF_CPP_MIN_LOG_LEVEL="3",
               COLUMNS="100")
    text = WALKTHROUGH.read_text()
    changed = []

    def replace(match):
        command, old = match.group(1), match.group(2)
        print(command, file=sys.stderr)
        new = run(command, env)
        if new != old:
            changed.append(command)
        return f"```\n{command}\n{new}```"

    updated = BLOCK.sub(replace, text)
    print(f"{len(changed)} block(s) changed", file=sys.stderr)
    if args.check:
        sys.exit(1 if changed else 0)
    WALKTHROUGH.write_text(updated)


if __name__ == "__main__":
    main()
