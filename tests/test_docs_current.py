"""The documents describe graphswap as it is now, for its users.

README.md and docs/*.md (CHANGELOG.md excepted: history belongs there) state behaviour and
measurements plainly: no issue numbers ("issue 26", "issues 25", "#26"), no work sessions
("this session"), no rounds of work ("round 4", "round-2", "this round").  Code spans and code
blocks are left out of the check (`graphswap.onnx_session`, `onnx_ops.session`, `--rounds 3` are
names, not history), and so are `tf.Session` / `Session(`.  No test file is named after a round
of work either (a name like test_security_roundN_files.py says when it was written, not what it
tests).
"""

import re
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
EXEMPT = {"CHANGELOG.md"}

FENCED_BLOCK = re.compile(r"^\s*```.*?^\s*```[^\n]*$", re.MULTILINE | re.DOTALL)
# an inline code span, which may wrap onto the next line of its paragraph (never past a blank one)
CODE_SPAN = re.compile(r"`(?:[^`\n]|\n(?![ \t]*\n))*`")
ALLOWED = re.compile(r"tf\.Session|Session\(")
HISTORY = [
    (re.compile(r"\bissues?[ -]#?\d+", re.IGNORECASE), "an issue number"),
    (re.compile(r"(?<![\w/])#\d+(?![\w-])"), "an issue number"),   # not keras#20585, not (#8-bit-...)
    (re.compile(r"\bsessions?\b", re.IGNORECASE), "a work session"),
    (re.compile(r"\brounds?[ -]?\d+\b", re.IGNORECASE), "a round of work"),
    (re.compile(r"\b(?:this|that|last|next|previous|earlier) round\b", re.IGNORECASE),
     "a round of work"),
]
ROUND_IN_NAME = re.compile(r"round[_-]?\d", re.IGNORECASE)


def _blank(match: re.Match) -> str:
    """The matched text with everything but its line breaks blanked (line numbers stay right)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def history_mentions(text: str) -> list:
    """(line number, text found, what it is) for each mention of history in a document's prose."""
    prose = CODE_SPAN.sub(_blank, FENCED_BLOCK.sub(_blank, text))
    prose = ALLOWED.sub(_blank, prose)
    found = []
    for number, line in enumerate(prose.splitlines(), 1):
        for pattern, what in HISTORY:
            found.extend((number, match.group(0), what) for match in pattern.finditer(line))
    return sorted(found)


def documents() -> list:
    docs = sorted(path for path in (REPOSITORY / "docs").glob("*.md") if path.name not in EXEMPT)
    return [REPOSITORY / "README.md", *docs]


def test_the_docs_name_no_issue_session_or_round():
    problems = {doc.name: history_mentions(doc.read_text()) for doc in documents()}
    problems = {name: found for name, found in problems.items() if found}
    assert not problems, problems


def test_no_test_file_is_named_after_a_round():
    named = sorted(str(path.relative_to(REPOSITORY)) for path in (REPOSITORY / "tests").rglob("*")
                   if path.is_file() and "__pycache__" not in path.parts
                   and ROUND_IN_NAME.search(path.name))
    assert not named, named


def test_the_checker_catches_history_and_spares_names():
    text = ("Measured in issue 26 on this session's CPU.\n"
            "Round 4 added it; see #31, issues 25 and the issue-37 decoder; round-2 fixtures.\n"
            "Before this round the default was other.\n"
            "Open it with `graphswap.onnx_session(path)` or `onnx_ops.session`, as a\n"
            "`tf.Session` would; `--rounds 3\n--variants lut`; keras-team/keras#20585;\n"
            "[8-bit](#8-bit-floating-point); rounded to nearest, round-off; tf.Session; Session(x)\n"
            "\n```python\nsession = graphswap.onnx_session('m.onnx')  # issue 26\n```\n")
    assert sorted(found for _, found, _ in history_mentions(text)) == sorted([
        "issue 26", "session", "Round 4", "#31", "issues 25", "issue-37", "round-2", "this round"])
