"""Every documented example is a test: each ```python block and each `graphswap ...`
command of README.md and docs/*.md runs against the shipped sample, in order, one temporary
directory per file (docs/doc_examples.py says exactly what counts and what the markers mean).
A renamed function, module or option fails here, naming the file and line."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("doc_examples", REPO / "docs" / "doc_examples.py")
doc_examples = importlib.util.module_from_spec(spec)
sys.modules["doc_examples"] = doc_examples
spec.loader.exec_module(doc_examples)

DocExampleError = doc_examples.DocExampleError


def _examples(name):
    return doc_examples.extract((REPO / name).read_text(), name)


DOCUMENTS_WITH_EXAMPLES = [name for name in doc_examples.DOCUMENTS if _examples(name)]


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSWAP_CONFIG_DIR", str(tmp_path / "config"))  # a first run's trust store
    work = tmp_path / "work"
    work.mkdir()
    doc_examples.prepare_workdir(work)
    return work


def test_the_examples_found_are_the_ones_the_documents_show():
    """The parser finds the examples a reader sees (and the fixed APIs are among them)."""
    found = {name: _examples(name) for name in doc_examples.DOCUMENTS}
    assert set(DOCUMENTS_WITH_EXAMPLES) >= {"README.md", "docs/EXPORT.md", "docs/GRADIENTS.md",
                                            "docs/WALKTHROUGH.md", "docs/EXPLORE.md"}
    export = [e for e in found["docs/EXPORT.md"] if e.mode == "run"]
    assert any(e.kind == "python" and "graphswap.onnx_session(" in e.code for e in export)
    assert sum(e.kind == "shell" for e in export) >= 9
    gradients = [e for e in found["docs/GRADIENTS.md"] if e.mode == "run"]
    assert any("graphswap.saliency_map(" in e.code for e in gradients)
    walkthrough = [e for e in found["docs/WALKTHROUGH.md"] if e.mode == "run"]
    assert len(walkthrough) == (REPO / "docs" / "WALKTHROUGH.md").read_text().count(
        "\n$ graphswap ")
    # markers stay rare: most examples run
    every = [e for examples in found.values() for e in examples]
    assert sum(e.mode == "run" for e in every) > 2 * sum(e.mode != "run" for e in every)


@pytest.mark.parametrize("name", DOCUMENTS_WITH_EXAMPLES)
def test_documented_examples_run(name, workdir):
    skipped = doc_examples.run_examples(_examples(name), workdir)
    for line in skipped:
        print(f"not run: {line}")


# ------------------------------------------------------------------------------------------------
# the checker itself catches what it is for


def _run_markdown(text, workdir, source="DOC.md"):
    return doc_examples.run_examples(doc_examples.extract(textwrap.dedent(text), source), workdir)


def test_a_renamed_function_in_a_python_block_fails_naming_its_line(workdir):
    text = """\
    # Title

    ```python
    import graphswap, keras
    model = keras.models.load_model("sample_models/lenet5.keras")
    swapped = graphswap.rewrite_model(model, kernel="exact")
    ```

    More text.

    ```python
    swapped = graphswap.rewrite_modell(model, kernel="mul8u_drum4")
    ```
    """
    with pytest.raises(DocExampleError, match=r"^DOC\.md:12: graphswap\.rewrite_modell: "
                                              r".*'rewrite_modell'"):
        _run_markdown(text, workdir)


def test_the_old_export_and_gradients_imports_fail(workdir):
    """What docs/EXPORT.md and docs/GRADIENTS.md once said (imports that no longer exist) fails
    the checker."""
    export = """\
    * open the model with

      ```python
      from graphswap import onnx_ops
      session = onnx_ops.session("model.ax.onnx")
      ```
    """
    with pytest.raises(DocExampleError, match=r"^DOC\.md:4: graphswap\.onnx_ops: "):
        _run_markdown(export, workdir)
    gradients = """\
    <!-- doc-test: names (a fragment) -->
    ```python
    import graphswap
    result = graphswap.saliency.saliency_map(model, image)
    ```
    """
    with pytest.raises(DocExampleError, match=r"^DOC\.md:4: graphswap\.saliency\.saliency_map"):
        _run_markdown(gradients, workdir)


def test_a_renamed_keyword_or_synopsis_option_fails_a_names_only_block(workdir):
    keyword = """\
    <!-- doc-test: names (a fragment) -->
    ```python
    static = graphswap.rewrite_model(model, kernel="mul8u_drum3",
                                     calibration_dataset=x_train)
    swapped.compile(...)
    ```
    """
    with pytest.raises(DocExampleError, match=r"^DOC\.md:4: graphswap\.rewrite_model\(\) takes "
                                              r"no argument 'calibration_dataset'"):
        _run_markdown(keyword, workdir)
    synopsis = """\
    <!-- doc-test: names (a synopsis) -->

        graphswap explore MODEL --data val.npz [--budgett 1.0]
    """
    with pytest.raises(DocExampleError, match=r"^DOC\.md:3: `graphswap explore` has no option "
                                              r"'--budgett'"):
        _run_markdown(synopsis, workdir)


def test_an_error_raised_inside_a_block_names_the_markdown_line(workdir):
    text = """\
    ```python
    import numpy as np
    data = np.load("sample_models/digits.npz")
    x = data["x_tset"]
    ```
    """
    with pytest.raises(DocExampleError, match=r"^DOC\.md:4: KeyError: .*x_tset"):
        _run_markdown(text, workdir)


def test_blocks_of_one_file_share_a_namespace_and_a_directory(workdir):
    text = """\
    ```python
    value = 41
    open("made_here.txt", "w").write("x")
    ```

    ```python
    assert value + 1 == 42
    assert open("made_here.txt").read() == "x"
    ```
    """
    assert _run_markdown(text, workdir) == []
    assert (workdir / "made_here.txt").read_text() == "x"


def test_a_renamed_command_or_option_fails_naming_its_line(workdir):
    option = """\
    Text.

        graphswap inspect sample_models/lenet5.keras
        graphswap convert sample_models/lenet5.keras --kernal mul8u_drum4 -o out.keras
    """
    with pytest.raises(DocExampleError, match=r"^DOC\.md:4: `graphswap convert` has no option "
                                              r"'--kernal'"):
        _run_markdown(option, workdir)
    assert not (workdir / "out.keras").exists()
    command = """\
    <!-- doc-test: names (a synopsis) -->
    ```
    $ graphswap sweeep MODEL --data test.npz
    output line mentioning graphswap sweep
    ```
    """
    with pytest.raises(DocExampleError, match=r"^DOC\.md:3: `graphswap` has no command 'sweeep'"):
        _run_markdown(command, workdir)


def test_a_failing_command_fails_with_its_exit_code_and_message(workdir):
    text = """\
    ```bash
    graphswap inspect no_such_model.keras
    ```
    """
    with pytest.raises(DocExampleError, match=r"(?s)^DOC\.md:2: `graphswap inspect "
                                              r"no_such_model.keras` exited with code 1:.*"
                                              r"Error: .*no_such_model\.keras"):
        _run_markdown(text, workdir)


def test_commands_run_with_needs_and_pipes_and_outputs_are_not_commands(workdir):
    text = """\
    <!-- doc-test: needs model.keras -->
    ```
    $ pip install . && graphswap inspect model.keras
    conv1        Conv2D        swapped  graphswap convert would swap it
    ```
    """
    examples = doc_examples.extract(textwrap.dedent(text), "DOC.md")
    assert [(e.line, e.code, e.needs) for e in examples] == [
        (3, "graphswap inspect model.keras", ("model.keras",))]
    assert doc_examples.run_examples(examples, workdir) == []
    assert (workdir / "model.keras").read_bytes() == (REPO / "sample_models" /
                                                      "lenet5.keras").read_bytes()


@pytest.mark.parametrize("text, message", [
    ("<!-- doc-test: skip -->\n```python\nx = 1\n```\n", r"DOC\.md:1: doc-test: skip needs a reason"),
    ("<!-- doc-test: needs weights.bin -->\n```python\nx = 1\n```\n",
     r"DOC\.md:1: doc-test: needs names unknown files \['weights.bin'\]"),
    ("<!-- doc-test: later (x) -->\n```python\nx = 1\n```\n", r"DOC\.md:1: unknown doc-test marker"),
    ("<!-- doc-test: skip (why) -->\nA paragraph.\n", r"DOC\.md:1: doc-test marker not followed"),
    ("Text.\n\n    import graphswap\n    graphswap.rewrite_model(m)\n",
     r"DOC\.md:3: an indented code block holds Python; fence it"),
])
def test_markers_and_blocks_the_checker_cannot_honour_are_errors(text, message):
    with pytest.raises(DocExampleError, match=message):
        doc_examples.extract(text, "DOC.md")


def test_a_skipped_block_is_reported_with_its_reason(workdir):
    text = """\
    <!-- doc-test: skip (needs a GPU cluster) -->
    ```python
    raise SystemExit("not run")
    ```
    """
    assert _run_markdown(text, workdir) == ["DOC.md:3: needs a GPU cluster"]
