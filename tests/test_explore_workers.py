"""Several explore workers on one study: real processes sharing a SQLite file (and, where the
PostgreSQL server binaries and a driver are installed, a throwaway PostgreSQL server) measure
every assignment and every estimate exactly once between them and end with the front a single
worker finds; bad study URLs and unreachable servers get one clear error."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner

import graphswap
from conftest import SAMPLE_DATA
from graphswap.cli import main
from graphswap.errors import GraphswapError
from graphswap.research import explore
from graphswap.research.exploration.study_database import study_storage

CIRCUITS = ["mul8u_trunc4", "mul8u_drum4", "mul8u_drum3"]
POWER = {"exact": 0.40, "mul8u_trunc4": 0.33, "mul8u_drum4": 0.20, "mul8u_drum3": 0.12}
WORKER = textwrap.dedent("""
    import json, sys
    import graphswap
    from graphswap.research.exploration import design_space
    model, data, table, study, log, front = sys.argv[1:7]
    measure = design_space.Evaluator.measure
    def logging_measure(self, assignment):
        with open(log, "a") as handle:   # one line per evaluation: examples and assignment
            handle.write(json.dumps([len(self.data), list(assignment.values())]) + "\\n")
        return measure(self, assignment)
    design_space.Evaluator.measure = logging_measure
    result = graphswap.explore(model, data, %r, metrics=table, budget=0.05, study=study,
                               estimate_samples=40, progress=False, claim_timeout=30)
    result.write(front)
""" % CIRCUITS)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """A two-layer dense net on the shipped digits (4^2 = 16 assignments), its data and table."""
    folder = tmp_path_factory.mktemp("explore_workers")
    with np.load(SAMPLE_DATA) as archive:
        x_train, y_train = archive["x_train"][:1000], archive["y_train"][:1000]
        x_test, y_test = archive["x_test"][:120], archive["y_test"][:120]
    keras.utils.set_random_seed(2)
    model = keras.Sequential([
        keras.Input((32, 32, 1)), keras.layers.Rescaling(1 / 255.0), keras.layers.Flatten(),
        keras.layers.Dense(12, activation="relu", name="hidden"),
        keras.layers.Dense(10, activation="softmax", name="out")], name="dense")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x_train, y_train, epochs=2, batch_size=64, verbose=0)
    path = folder / "dense.keras"
    model.save(path)
    data = folder / "val.npz"
    np.savez(data, x=x_test, y=y_test)
    table = folder / "power.csv"
    table.write_text("name,power\n" + "".join(f"{k},{v}\n" for k, v in POWER.items()))
    return {"path": path, "data": data, "table": table, "folder": folder}


def _front(document) -> list:
    return [(tuple(p["assignment"].values()), p["accuracy"], p["relative_cost"])
            for p in document["front"]]


def _run_workers(dense, study, folder, count):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": str(Path(graphswap.__file__).resolve().parent.parent)}
    processes, logs, fronts = [], [], []
    for index in range(count):
        log, front = folder / f"worker{index}.log", folder / f"front{index}.json"
        logs.append(log)
        fronts.append(front)
        processes.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, str(dense["path"]), str(dense["data"]),
             str(dense["table"]), study, str(log), str(front)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for process in processes:
        output, _ = process.communicate(timeout=1200)
        assert process.returncode == 0, output[-3000:]
    return logs, fronts


def _check_shared_work(dense, study, folder, count):
    logs, fronts = _run_workers(dense, study, folder, count)
    evaluations = [json.loads(line) for log in logs if log.exists()
                   for line in log.read_text().splitlines()]
    full = [tuple(a) for n, a in evaluations if n == 120]
    estimates = [tuple(a) for n, a in evaluations if n == 40]
    # every assignment measured once in all (4^2), every estimate (all exact + 2 x 3) once
    assert len(full) == len(set(full)) == 16
    assert len(estimates) == len(set(estimates)) == 7
    assert sum(1 for log in logs if log.exists() and log.read_text()) >= 2  # work was shared
    single = explore(dense["path"], dense["data"], CIRCUITS, metrics=dense["table"],
                     budget=0.05, estimate_samples=40, progress=False)
    expected = _front(single.to_dict())
    for front in fronts:
        document = json.loads(front.read_text())
        assert _front(document) == expected
        assert document["best"]["assignment"] == single.best["assignment"]
    return logs


def test_three_workers_on_one_sqlite_study_measure_each_assignment_once(dense, tmp_path):
    _check_shared_work(dense, str(tmp_path / "study.db"), tmp_path, 3)
    # the finished study answers a new budget at once, by path or by URL
    again = explore(dense["path"], dense["data"], CIRCUITS, metrics=dense["table"],
                    budget=0.1, estimate_samples=40, progress=False,
                    study=f"sqlite:///{tmp_path / 'study.db'}")
    assert again.counts["full_evaluations_this_run"] == 0 and again.counts["stored_before"] == 16


def test_bad_study_urls_get_one_clear_error(dense, tmp_path):
    cases = [("redis://localhost/0", r"has the scheme 'redis'; allowed: a SQLite file path"),
             ("http://user:secret@host/db", r"http://user:\*\*\*@host/db has the scheme"),
             ("sqlite://", r"names no database file"),
             ("sqlite:///", r"names no database file")]
    for url, message in cases:
        with pytest.raises(GraphswapError, match=message) as caught:
            study_storage(url)
        assert "secret" not in str(caught.value)
    port = _free_port()
    url = f"postgresql://graphswap:secret@127.0.0.1:{port}/nothing"
    args = ["explore", str(dense["path"]), "--data", str(dense["data"]), "--library",
            CIRCUITS[0], "--metrics", str(dense["table"]), "--study", url,
            "-o", str(tmp_path / "f.json")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and result.output.startswith("Error: cannot open the study ")
    assert "Traceback" not in result.output and "secret" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert ("not installed" in result.output or "server runs and is reachable" in result.output)
    assert not (tmp_path / "f.json").exists()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


PG_BINARIES = ("initdb", "pg_ctl", "postgres")


def test_two_workers_on_a_postgresql_study(dense, tmp_path):
    missing = [name for name in PG_BINARIES if shutil.which(name) is None
               and not os.path.exists(f"/usr/local/bin/{name}")]
    if missing:
        pytest.skip(f"PostgreSQL server binaries not installed: {', '.join(missing)}")
    pytest.importorskip("psycopg2", reason="the PostgreSQL driver psycopg2 (test extra "
                                           "psycopg2-binary) is not installed")
    binary = {name: shutil.which(name) or f"/usr/local/bin/{name}" for name in PG_BINARIES}
    # PostgreSQL refuses to run as root: as root, the server runs as an unprivileged user, in
    # a folder of its own outside the root-only pytest folder
    user = None
    if os.geteuid() == 0:
        import pwd

        for name in ("postgres", "nobody"):
            try:
                user = pwd.getpwnam(name)
                break
            except KeyError:
                continue
        assert user is not None, "running as root, and no user 'postgres' or 'nobody' to run " \
                                 "the PostgreSQL server as"
    work = Path(tempfile.mkdtemp(prefix="graphswap-pg-"))
    if user is not None:
        os.chown(work, user.pw_uid, user.pw_gid)
    prefix = [] if user is None else ["runuser", "-u", user.pw_name, "--"]
    data_dir, port = work / "data", _free_port()
    subprocess.run([*prefix, binary["initdb"], "-D", str(data_dir), "-U", "graphswap",
                    "--auth=trust"], check=True, capture_output=True)
    subprocess.run([*prefix, binary["pg_ctl"], "-D", str(data_dir), "-o",
                    f"-p {port} -k {work} -c listen_addresses=127.0.0.1", "-w", "start",
                    "-l", str(work / "pg.log")], check=True, capture_output=True)
    try:
        url = f"postgresql://graphswap@127.0.0.1:{port}/postgres"
        _check_shared_work(dense, url, tmp_path, 2)
    finally:
        subprocess.run([*prefix, binary["pg_ctl"], "-D", str(data_dir), "-m", "immediate",
                        "stop"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)



OPENER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from graphswap.research.exploration.study_database import Study
    path, folder, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    (folder / f"ready{time.time_ns()}").touch()   # imports done: wait for the others
    while len(list(folder.glob("ready*"))) < count:
        time.sleep(0.01)
    study = Study(path, {"model": "m"}, ["a"], [["exact", "x"]])
    print(study.study.user_attrs["fingerprint"]["model"])
""")


def test_workers_opening_a_new_sqlite_study_at_one_instant_all_succeed(tmp_path):
    """The first workers on a new study race to create optuna's tables and the study itself
    (CI once saw 'table study_directions already exists'): every one of them must open it."""
    env = {**os.environ, "PYTHONPATH": str(Path(graphswap.__file__).resolve().parent.parent)}
    for round_ in range(2):
        folder = tmp_path / f"round{round_}"
        folder.mkdir()
        processes = [subprocess.Popen(
            [sys.executable, "-c", OPENER, str(folder / "race.db"), str(folder), "5"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(5)]
        for process in processes:
            output, _ = process.communicate(timeout=300)
            assert process.returncode == 0 and output.strip().endswith("m"), output[-2000:]


def test_a_claim_whose_owner_is_not_yet_written_is_not_taken_over_at_once(tmp_path):
    """Between creating a claim and writing its owner a worker holds a claim with no owner; a
    waiting worker took it over at once as a dead worker's, and the assignment was measured twice
    (CI, two workers on PostgreSQL, a loaded machine).  It is stale only after claim_timeout."""
    import time

    from graphswap.research.exploration.study_database import Study

    path = str(tmp_path / "claims.db")
    first = Study(path, {"model": "m"}, ["a"], [["exact", "x"]], claim_timeout=0.5)
    second = Study(path, {"model": "m"}, ["a"], [["exact", "x"]], claim_timeout=0.5)
    try:
        # the first worker's claim, caught between its two writes: the claim, no owner yet
        first.storage.create_new_study([first.optuna.study.StudyDirection.MINIMIZE],
                                       first._claim_name("exact,x", 0))
        assert not second.claim_is_stale("exact,x", 0)
        time.sleep(0.7)
        assert second.claim_is_stale("exact,x", 0)     # its worker died in between: taken over
        # a claim with a live owner is never stale; one whose owner stopped beating is
        assert first.claim("exact,exact") and not second.claim("exact,exact")
        assert not second.claim_is_stale("exact,exact", 0)
        first.close()
        time.sleep(0.7)
        assert second.claim_is_stale("exact,exact", 0)
    finally:
        first.close()
        second.close()
