"""Every documented example is a test: the Python blocks and `graphswap ...` commands of README.md
and docs/*.md, found and run the way a reader would run them (tests/test_docs_examples.py).

What counts as an example
  * a fenced block tagged ```python (or py): run as one piece of code;
  * a `graphswap ...` command in a fenced block (untagged, bash, sh, shell, console) or an
    indented code block.  In a block where some lines start with `$ `, only those lines are
    commands (the rest is their printed output); otherwise every line is.  `a && b`, `a | b` and
    `a; b` are split and each `graphswap` part is run; other programs in a command line
    (`pip install .`, `pytest`) are not: the examples run against the installed package.
    A line ending in `\\` continues on the next; `# ...` comments are dropped.
  * an indented (unfenced) block that looks like Python (an `import` line or a `graphswap.NAME(`
    call) is an error: fence it as ```python so it is run.

How they run
  All examples of one file run in order in one fresh temporary directory holding a copy of
  sample_models/ (so `sample_models/lenet5.keras` and `sample_models/digits.npz` resolve), and its
  Python blocks share one namespace, as a reader working through the page would.  Commands run
  in-process through graphswap's click group and must exit with code 0; a failure raises
  DocExampleError naming the file and the line (for Python, the line of the block that raised).

Markers: an HTML comment on a line of its own before a block (blank lines may sit between):
  <!-- doc-test: skip (REASON) -->      not run at all; the reason is required and shown.
  <!-- doc-test: names (REASON) -->     a fragment (literal `...`, a user's own file): not run,
        but every graphswap name it uses is resolved - for Python each `import`/`from graphswap
        ...` and attribute chain rooted at a graphswap module (`graphswap.kernels.lut`,
        `gg.ClipByNorm`; `graphswap` itself counts as imported) and the keyword arguments of
        calls to them; for a command its subcommand and every `--option` (also inside a
        synopsis' brackets) - so a rename fails.  Blocks that run get the same name check first.
  <!-- doc-test: needs FILE [FILE ...] -->   the block is run after FILEs are placed in the working
        directory; only the names in NEEDS below are known (each is a shipped sample or made
        from one), anything else is an error.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import shlex
import shutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE_MODELS = REPO / "sample_models"
DOCUMENTS = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))

MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(\w+)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
PYTHON_LANGS = {"python", "py"}
LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s+")
PYTHON_LOOKING = re.compile(r"^\s*(import \w|from [\w.]+ import )|\bgraphswap\.\w+\(", re.M)


class DocExampleError(Exception):
    """A documented example that does not run (or a marker the checker cannot honour)."""


@dataclass
class Example:
    source: str          # the markdown file, as named in messages
    line: int            # 1-based line of the code (the command's line for a shell example)
    kind: str            # "python" | "shell"
    code: str            # Python source (dedented), or one command line
    mode: str = "run"    # "run" | "names" | "skip"
    reason: str = ""
    needs: tuple = field(default_factory=tuple)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


# --------------------------------------------------------------------------------------------
# parsing

def _marker(line: str, source: str, number: int):
    match = MARKER.match(line)
    if not match:
        return None
    mode, rest = match.group(1), match.group(2)
    if mode not in ("skip", "names", "needs"):
        raise DocExampleError(f"{source}:{number}: unknown doc-test marker {mode!r}; allowed: "
                              "skip (REASON), names (REASON), needs FILE ...")
    if mode in ("skip", "names"):
        reason = rest.strip()
        if not (reason.startswith("(") and reason.endswith(")") and len(reason) > 2):
            raise DocExampleError(f"{source}:{number}: doc-test: {mode} needs a reason in "
                                  "parentheses, e.g. <!-- doc-test: skip (needs a GPU cluster) -->")
        return mode, reason[1:-1], ()
    names = tuple(rest.split())
    unknown = [n for n in names if n not in NEEDS]
    if not names or unknown:
        raise DocExampleError(f"{source}:{number}: doc-test: needs names unknown files "
                              f"{unknown or '(none given)'}; known: {', '.join(sorted(NEEDS))}")
    return "run", "", names


def _runs_graphswap(text: str) -> bool:
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:
        return False
    while tokens and re.match(r"^[A-Za-z_]\w*=", tokens[0]):
        tokens = tokens[1:]
    return bool(tokens) and tokens[0] == "graphswap"


def _shell_examples(lines, first_line, source, marker, require_dollar_for_untagged):
    """One Example per `graphswap` command of a block's lines."""
    joined, i = [], 0
    while i < len(lines):
        start, text = i, lines[i]
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i].strip()
        joined.append((first_line + start, text.strip()))
        i += 1
    dollar = any(t.startswith("$ ") for _, t in joined)
    if dollar:
        joined = [(n, t[2:]) for n, t in joined if t.startswith("$ ")]
    elif require_dollar_for_untagged:   # an untagged block without `$`: output unless a command
        joined = [(n, t) for n, t in joined if _runs_graphswap(t)]
    examples = []
    for number, text in joined:
        if "graphswap" not in text:
            continue
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError:
            continue
        segments, current = [], []
        for token in tokens:
            if token in ("&&", "|", ";", "||"):
                segments.append(current)
                current = []
            else:
                current.append(token)
        segments.append(current)
        for segment in segments:
            while segment and re.match(r"^[A-Za-z_]\w*=", segment[0]):
                segment = segment[1:]
            if segment and segment[0] == "graphswap":
                mode, reason, needs = marker or ("run", "", ())
                examples.append(Example(source, number, "shell", shlex.join(segment),
                                        mode, reason, needs))
    return examples


def extract(text: str, source: str) -> list[Example]:
    """The examples of one markdown text, in order."""
    lines = text.split("\n")
    examples: list[Example] = []
    marker, marker_line = None, 0
    base = 0                     # indentation of the text an indented block is relative to
    previous_blank = True
    i = 0

    def take_marker():
        nonlocal marker
        found, marker = marker, None
        return found

    while i < len(lines):
        line = lines[i]
        found = _marker(line, source, i + 1)
        if found:
            if marker:
                raise DocExampleError(f"{source}:{marker_line}: doc-test marker not followed by "
                                      "a code block")
            marker, marker_line = found, i + 1
            i += 1
            previous_blank = True
            continue
        fence = FENCE.match(line)
        if fence:
            indent, ticks, lang = fence.group(1), fence.group(2), fence.group(3).lower()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(ticks):
                j += 1
            body = [b[len(indent):] if b.startswith(indent) else b.lstrip() for b in lines[i + 1:j]]
            this_marker = take_marker()
            if lang in PYTHON_LANGS:
                mode, reason, needs = this_marker or ("run", "", ())
                examples.append(Example(source, i + 2, "python", "\n".join(body), mode, reason,
                                        needs))
            elif lang in SHELL_LANGS:
                found_here = _shell_examples(body, i + 2, source, this_marker,
                                             require_dollar_for_untagged=(lang == ""))
                examples.extend(found_here)
                if this_marker and not found_here:
                    raise DocExampleError(f"{source}:{marker_line}: doc-test marker on a block "
                                          "with no example")
            elif this_marker:
                raise DocExampleError(f"{source}:{marker_line}: doc-test marker on a ```{lang} "
                                      "block, which is not checked")
            i = j + 1
            previous_blank = True
            continue
        stripped = line.strip()
        width = len(line) - len(line.lstrip())
        if stripped and previous_blank and width >= base + 4:
            j = i
            while j < len(lines) and (not lines[j].strip()
                                      or len(lines[j]) - len(lines[j].lstrip()) >= base + 4):
                j += 1
            while j > i and not lines[j - 1].strip():
                j -= 1
            block = lines[i:j]
            cut = min(len(b) - len(b.lstrip()) for b in block if b.strip())
            body = [b[cut:] for b in block]
            this_marker = take_marker()
            found_here = _shell_examples(body, i + 1, source, this_marker,
                                         require_dollar_for_untagged=False)
            rest = "\n".join(b for b in body if not b.lstrip().startswith(("graphswap ", "$ ")))
            if PYTHON_LOOKING.search(rest):
                raise DocExampleError(f"{source}:{i + 1}: an indented code block holds Python; "
                                      "fence it as ```python so the checker runs it")
            examples.extend(found_here)
            if this_marker and not found_here:
                raise DocExampleError(f"{source}:{marker_line}: doc-test marker on a block with "
                                      "no example")
            i = j
            previous_blank = False
            continue
        if stripped:
            if marker:
                raise DocExampleError(f"{source}:{marker_line}: doc-test marker not followed by "
                                      "a code block")
            item = LIST_ITEM.match(line)
            base = len(item.group(0)) if item else width
            previous_blank = False
        else:
            previous_blank = True
        i += 1
    if marker:
        raise DocExampleError(f"{source}:{marker_line}: doc-test marker not followed by a code "
                              "block")
    return examples


# --------------------------------------------------------------------------------------------
# files a `needs` marker may ask for

def _copy(source):
    def make(target: Path):
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copyfile(source, target)
    return make


def _swapped_model(target: Path):
    import keras

    import graphswap
    model = keras.models.load_model(SAMPLE_MODELS / "lenet5.keras")
    graphswap.rewrite_model(model, kernel="mul8u_drum4").save(target)


NEEDS = {
    "model.keras": _copy(SAMPLE_MODELS / "lenet5.keras"),
    "model.swapped.keras": _swapped_model,      # lenet5 converted with mul8u_drum4
    "model.ft.keras": _swapped_model,
    "train.npz": _copy(SAMPLE_MODELS / "digits.npz"),
    "val.npz": _copy(SAMPLE_MODELS / "digits.npz"),
    "test.npz": _copy(SAMPLE_MODELS / "digits.npz"),
    "mymul.c": _copy(SAMPLE_MODELS / "multipliers" / "mul8u_gsot45.c"),
    "runs/": lambda target: target.mkdir(),     # an output directory the text says to create
}


# --------------------------------------------------------------------------------------------
# checking names without running

def _resolve(path: str):
    """The object at a dotted graphswap path (modules imported as needed), or raise."""
    parts = path.split(".")
    obj = importlib.import_module(parts[0])
    for depth, part in enumerate(parts[1:], start=2):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:depth]))
        except ImportError:
            raise AttributeError(f"{'.'.join(parts[:depth - 1])} has no {part!r}") from None
    return obj


def check_python_names(example: Example) -> None:
    try:
        tree = ast.parse(example.code)
    except SyntaxError as error:
        raise DocExampleError(f"{example.source}:{example.line + (error.lineno or 1) - 1}: "
                              f"SyntaxError: {error.msg}") from None
    aliases = {"graphswap": "graphswap"}   # a reader has imported graphswap
    problems = []

    def need(path, node):
        try:
            return _resolve(path)
        except (ImportError, AttributeError) as error:
            problems.append((example.line + node.lineno - 1, f"{path}: {error}"))
            return None

    def dotted(node):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in aliases:
            return ".".join([aliases[node.id], *reversed(chain)])
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "graphswap":
                    need(alias.name, node)
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "graphswap":
            for alias in node.names:
                need(f"{node.module}.{alias.name}", node)
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and dotted(node):
            need(dotted(node), node)
        elif isinstance(node, ast.Call) and dotted(node.func) and node.keywords:
            # keyword arguments of a graphswap callable must be parameters it takes
            target = need(dotted(node.func), node)
            try:
                parameters = inspect.signature(target).parameters if target else {}
            except (TypeError, ValueError):
                parameters = {}
            if parameters and not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
                for keyword in node.keywords:
                    if keyword.arg is not None and keyword.arg not in parameters:
                        problems.append((example.line + keyword.value.lineno - 1,
                                         f"{dotted(node.func)}() takes no argument "
                                         f"{keyword.arg!r}"))
    if problems:
        line, text = min(problems)
        raise DocExampleError(f"{example.source}:{line}: {text}")


def _cli():
    from graphswap.cli import main
    return main


def _command_and_options(example: Example):
    import click

    tokens = shlex.split(example.code)[1:]
    command, path = _cli(), ["graphswap"]
    while isinstance(command, click.Group) and tokens and not tokens[0].startswith("-"):
        name = tokens.pop(0)
        sub = command.get_command(click.Context(command), name)
        if sub is None:
            raise DocExampleError(f"{example.where}: `{' '.join(path)}` has no command {name!r}")
        command, path = sub, [*path, name]
    return command, path, tokens


def check_shell_names(example: Example) -> None:
    command, path, tokens = _command_and_options(example)
    known = {"--help", "-h"}
    for param in command.params:
        known.update(getattr(param, "opts", ()))
        known.update(getattr(param, "secondary_opts", ()))
    for token in tokens:
        token = token.lstrip("[").rstrip("]")       # a synopsis' [--option VALUE]
        if token.startswith("-") and token not in ("-", "--"):
            name = token.split("=", 1)[0]
            if name not in known and not re.fullmatch(r"-\d.*", name):
                raise DocExampleError(f"{example.where}: `{' '.join(path)}` has no option "
                                      f"{name!r}")


# --------------------------------------------------------------------------------------------
# running

def prepare_workdir(workdir: Path) -> None:
    """A fresh working directory with a copy of sample_models/ (commands may write beside it)."""
    shutil.copytree(SAMPLE_MODELS, workdir / "sample_models",
                    ignore=shutil.ignore_patterns("__pycache__"))


def _place(needs, workdir: Path) -> None:
    for name in needs:
        target = workdir / name
        if not target.exists():
            NEEDS[name](target)


def run_python(example: Example, namespace: dict) -> None:
    # Padding keeps the markdown's line numbers in the traceback.
    code = "\n" * (example.line - 1) + example.code
    try:
        compiled = compile(code, example.source, "exec")
        exec(compiled, namespace)
    except SyntaxError as error:
        raise DocExampleError(f"{example.source}:{error.lineno}: SyntaxError: {error.msg}") \
            from None
    except BaseException as error:  # noqa: BLE001 - any failure of the example is reported
        if isinstance(error, KeyboardInterrupt):
            raise
        frames = [f for f in traceback.extract_tb(error.__traceback__)
                  if f.filename == example.source]
        line = frames[-1].lineno if frames else example.line
        raise DocExampleError(f"{example.source}:{line}: {type(error).__name__}: {error}") \
            from error


def run_shell(example: Example, env: dict) -> None:
    from click.testing import CliRunner

    check_shell_names(example)
    args = shlex.split(example.code)[1:]
    result = CliRunner().invoke(_cli(), args, env=env, catch_exceptions=True)
    if result.exit_code != 0:
        output = (result.output or "").strip().splitlines()[-8:]
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            output.append("".join(traceback.format_exception(result.exception))[-1500:])
        raise DocExampleError(f"{example.where}: `{example.code}` exited with code "
                              f"{result.exit_code}:\n" + "\n".join(output))


def run_examples(examples: list[Example], workdir: Path, env: dict | None = None) -> list[str]:
    """Run one file's examples in order in workdir (already prepared); returns what was skipped
    (`where: reason`), raises DocExampleError at the first failure."""
    skipped, namespace = [], {"__name__": "__doc_example__"}
    env = dict(env or {})
    previous = Path.cwd()
    os.chdir(workdir)
    sys.path.insert(0, str(workdir))
    try:
        for example in examples:
            if example.mode == "skip":
                skipped.append(f"{example.where}: {example.reason}")
                continue
            if example.mode == "names":
                (check_python_names if example.kind == "python" else check_shell_names)(example)
                continue
            _place(example.needs, workdir)
            if example.kind == "python":
                check_python_names(example)
                run_python(example, namespace)
            else:
                run_shell(example, env)
    finally:
        os.chdir(previous)
        sys.path.remove(str(workdir))
    return skipped


def main() -> None:
    """python docs/doc_examples.py [--list]: list the examples (the tests run them)."""
    for name in DOCUMENTS:
        for example in extract((REPO / name).read_text(), name):
            extra = f" [{example.mode}{': ' + example.reason if example.reason else ''}" \
                    f"{' needs ' + ' '.join(example.needs) if example.needs else ''}]"
            first = example.code.strip().splitlines()[0] if example.code.strip() else ""
            print(f"{example.where:28} {example.kind:6} {first[:90]}{extra}")


if __name__ == "__main__":
    main()
