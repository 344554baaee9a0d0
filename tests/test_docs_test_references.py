"""Every test a document names exists: README.md and docs/*.md cite the tests that hold their
claims (`tests/test_x.py::test_name`, and `::test_other` for another test of the same file, up to
the paragraph's end), so a renamed or deleted test breaks the build, not the reader's trust."""

import re
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"(?:tests/)?(test_\w+\.py)?::(test_\w+)")


def _defined_tests() -> dict:
    return {path.name: set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(),
                                      re.MULTILINE))
            for path in (REPOSITORY / "tests").glob("test_*.py")}


def unresolved_references(text: str, defined: dict) -> list:
    """(line number, reference, why) of each test reference in `text` that names no test."""
    found, current = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            current = None      # a bare `::name` belongs to the file named in its paragraph
        for match in REFERENCE.finditer(line):
            current = match.group(1) or current
            if current is None:
                found.append((number, match.group(0), "no test file named before it"))
            elif current not in defined:
                found.append((number, match.group(0), f"tests/{current} does not exist"))
            elif match.group(2) not in defined[current]:
                found.append((number, match.group(0), f"tests/{current} defines no such test"))
    return found


def test_every_test_named_in_the_docs_exists():
    defined = _defined_tests()
    documents = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
    problems = {doc.name: unresolved_references(doc.read_text(), defined) for doc in documents}
    problems = {name: found for name, found in problems.items() if found}
    assert not problems, problems
    assert sum(len(REFERENCE.findall(doc.read_text())) for doc in documents) > 100


def test_the_checker_catches_a_renamed_test_and_a_missing_file():
    defined = {"test_a.py": {"test_one", "test_two"}}
    text = ("held by `tests/test_a.py::test_one`, `::test_two`\nand `::test_three`\n\n"
            "`::test_one` alone\n| row | `test_b.py::test_one` |")
    assert unresolved_references(text, defined) == [
        (2, "::test_three", "tests/test_a.py defines no such test"),
        (4, "::test_one", "no test file named before it"),
        (5, "test_b.py::test_one", "tests/test_b.py does not exist")]
