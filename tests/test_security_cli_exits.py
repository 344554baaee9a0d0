"""A study database defined otherwise than graphswap creates it is refused untouched; every error
of the command line - click's usage errors too - exits with code 1, as the README says."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import one_error_line
from graphswap.cli import main
from graphswap.errors import GraphswapError
from graphswap.research.exploration import design_space
from graphswap.research.exploration.study_files import check_study_file

REPO = Path(graphswap.__file__).resolve().parent.parent
LAYERS, CHOICES = ["out"], ["exact", "mul8u_drum4"]
FINGERPRINT = {"model": "m", "data": "d"}
METRICS = {"accuracy": 0.75, "loss": 0.5, "agreement": 0.9, "drop": 0.05}


# --------------------------------------------------------------------------------------------
# study databases: exactly the schema graphswap creates
# --------------------------------------------------------------------------------------------

def _graphswap_study(path: Path) -> Path:
    study = design_space.Study(path, FINGERPRINT, LAYERS, CHOICES)
    study.record({"out": "mul8u_drum4"}, METRICS, 0.5)
    study.close()
    return path


def _edit_schema(path: Path, name: str, old: str, new: str) -> None:
    """Change the definition of `name` in place (as a hostile tool would), keeping its rows."""
    with sqlite3.connect(path) as connection:
        sql = connection.execute("SELECT sql FROM sqlite_master WHERE name = ?",
                                 (name,)).fetchone()[0]
        assert old in sql, sql
        connection.execute("PRAGMA writable_schema = ON")
        connection.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?",
                           (sql.replace(old, new), name))
        connection.execute("PRAGMA writable_schema = OFF")
    connection.close()


@pytest.mark.parametrize("name, old, new", [
    ("trial_values", "UNIQUE (trial_id, objective)",
     "UNIQUE (trial_id, objective) ON CONFLICT REPLACE"),
    ("trial_user_attributes", "UNIQUE (trial_id, \"key\")",
     "UNIQUE (trial_id, \"key\") ON CONFLICT REPLACE"),
    ("trials", "state VARCHAR(8) NOT NULL", "state VARCHAR(8) NOT NULL DEFAULT 'COMPLETE'"),
])
def test_a_study_whose_tables_are_defined_otherwise_is_refused_untouched(tmp_path, name, old,
                                                                         new):
    path = _graphswap_study(tmp_path / "study.db")
    check_study_file(path)   # the study graphswap wrote passes
    _edit_schema(path, name, old, new)
    before = path.read_bytes()
    with pytest.raises(GraphswapError) as caught:
        design_space.Study(path, FINGERPRINT, LAYERS, CHOICES)
    message = str(caught.value)
    assert f"the study {path} defines table {name} otherwise than graphswap creates it" in message
    assert "would let the next write replace or lose measured results" in message
    assert path.read_bytes() == before


def test_an_index_of_its_own_on_an_optuna_table_is_refused(tmp_path):
    path = _graphswap_study(tmp_path / "study.db")
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE UNIQUE INDEX mine ON trial_values (value)")
    connection.close()
    with pytest.raises(GraphswapError, match=r"defines index mine otherwise than graphswap "
                                             r"creates it"):
        check_study_file(path)


def test_a_study_value_nested_100000_deep_is_refused(tmp_path):
    path = _graphswap_study(tmp_path / "study.db")
    with sqlite3.connect(path) as connection:
        changed = connection.execute("UPDATE study_user_attributes SET value_json = ? WHERE key "
                                     "= 'fingerprint'", ("[" * 100000 + "]" * 100000,)).rowcount
    connection.close()
    assert changed == 1
    with pytest.raises(GraphswapError, match=r"holds a value nested 100,000 levels deep in its "
                                             r"table study_user_attributes, more than the 64"):
        design_space.Study(path, FINGERPRINT, LAYERS, CHOICES)


def test_explore_refuses_a_study_with_on_conflict_replace_in_one_line(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax",
                                                                    name="out")])
    model.compile(loss="sparse_categorical_crossentropy")
    model_path = tmp_path / "dense.keras"
    model.save(model_path)
    data = tmp_path / "val.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((12, 4)).astype(np.float32),
             y=np.arange(12) % 3)
    table = tmp_path / "power.csv"
    table.write_text("name,power\nexact,0.4\nmul8u_drum4,0.2\n")
    study = tmp_path / "study.db"
    args = ["explore", model_path, "--data", data, "--library", "mul8u_drum4", "--metrics",
            table, "--budget", "90", "--include", "out", "--study", study]
    first = CliRunner().invoke(main, [str(a) for a in args + ["-o", tmp_path / "a.json"]])
    assert first.exit_code == 0, first.output
    _edit_schema(study, "trial_values", "UNIQUE (trial_id, objective)",
                 "UNIQUE (trial_id, objective) ON CONFLICT REPLACE")
    before = study.read_bytes()
    line = one_error_line(CliRunner().invoke(main, [str(a) for a in args + ["-o",
                                                                          tmp_path / "b.json"]]))
    assert "defines table trial_values otherwise than graphswap creates it" in line
    assert study.read_bytes() == before and not (tmp_path / "b.json").exists()


# --------------------------------------------------------------------------------------------
# usage errors exit 1
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["convert"], "Missing argument 'MODEL'"),
    (["convert", "m.keras", "--no-such-option"], "No such option '--no-such-option'"),
    (["convert", "m.keras", "--backward", "nonsense"], "'nonsense' is not one of"),
    (["convert", "m.keras", "--check-batch", "100000"], "Invalid value for '--check-batch'"),
    (["nonsense"], "No such command 'nonsense'"),
    (["--bogus"], "No such option '--bogus'"),
    (["trust", "add"], "Missing argument"),
    (["kernels", "check"], "Missing argument"),
])
def test_usage_errors_exit_1_with_one_error_line(args, message):
    result = CliRunner().invoke(main, args, prog_name="graphswap")
    line = one_error_line(result)
    assert message in line, result.output
    assert "for help" in result.output   # click's pointer to --help is kept


def test_a_usage_error_exits_1_from_the_console_command():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")])}
    process = subprocess.run([sys.executable, "-m", "graphswap_command", "convert", "m.keras",
                              "--backward", "nonsense"], capture_output=True, text=True,
                             timeout=300, env=env, cwd=str(REPO))
    assert process.returncode == 1, process.stderr
    assert "Error: Invalid value for '--backward'" in process.stderr
    assert process.stdout == ""
