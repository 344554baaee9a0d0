"""The study database of an exploration: every measurement kept in an optuna study (optuna's RDB
storage - a SQLite file, or a PostgreSQL/MySQL server's URL that several workers share - or in
memory), checked to hold only what graphswap writes; the fingerprint that ties a study to one
exploration; the claims and heartbeats that let several workers share one study without
measuring anything twice."""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import uuid

import numpy as np

from graphswap.errors import GraphswapError, InputFileError
from graphswap.input_files import load_json
from graphswap.research.exploration.study_files import (  # noqa: F401 - the file's check, as before
    OPTUNA_TABLES, STUDY_DIALECTS, STUDY_NAME, check_study_file, study_storage)


def model_fingerprint(model) -> str:
    """Architecture and weights of the model being explored."""
    digest = hashlib.sha256(json.dumps(model.get_config(), sort_keys=True, default=str).encode())
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def data_fingerprint(data) -> str:
    digest = hashlib.sha256(f"{len(data)}".encode())
    if data.x is not None:
        digest.update(np.ascontiguousarray(data.x).tobytes())
        digest.update(np.ascontiguousarray(data.y).tobytes())
    else:
        digest.update(str(data.source).encode())
    return digest.hexdigest()


def _storage_error(shown, exc) -> GraphswapError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, ImportError) and isinstance(exc.__cause__, ModuleNotFoundError):
        exc = exc.__cause__   # optuna's "Failed to import DB access module", from the driver's
    if isinstance(exc, ModuleNotFoundError):
        return GraphswapError(
            f"cannot open the study {shown}: the database driver {exc.name!r} is not installed; "
            f"install it (PostgreSQL: pip install psycopg2-binary; MySQL: pip install pymysql "
            f"and write mysql+pymysql://...)")
    return GraphswapError(
        f"cannot open the study {shown}: {type(exc).__name__}: {text[:300]}; check that the "
        f"database server runs and is reachable, and the URL's user, password and database")


_CREATE_ATTEMPTS = 8


def _lost_creation_race(exc) -> bool:
    """Whether `exc` is what a worker gets when another created the same tables or study at the
    same moment: retrying then finds them made."""
    text = f"{type(exc).__name__} {exc}".lower()
    return ("integrityerror" in text or "already exists" in text
            or "database is locked" in text or "duplicate" in text)


#: seconds between a worker's heartbeats, and without one after which its claims are taken over
HEARTBEAT_SECONDS = 5.0
DEFAULT_CLAIM_TIMEOUT = 60.0
CLAIM_PREFIX = STUDY_NAME + ":claim:"


class Study:
    """Every measurement of an exploration, kept in an optuna study (optuna's RDB storage: a
    SQLite file or a database server's URL; in memory when None): full evaluations as completed
    trials (params = the assignment, values = (drop, cost), user attributes = the metrics),
    estimates and fine-tuned accuracies as study attributes.  A study belongs to one model, one
    data set, one library and one set of settings (its fingerprint); another is refused.

    Several workers (processes, on any machines) may share one study: before measuring anything a
    worker claims it (`claim`: creating an optuna study named after it, which the database
    creates at most once - the study name is unique), so no assignment is measured twice.  A
    worker records a heartbeat; the claims of a worker silent for `claim_timeout` seconds (killed)
    are taken over by a waiting one."""

    def __init__(self, path, fingerprint: dict, layers: list, choices: list, sampler=None,
                 claim_timeout: float = DEFAULT_CLAIM_TIMEOUT, score_max: float = 1.0):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.layers = layers
        self.choices = choices
        self.claim_timeout = float(claim_timeout)
        self.score_max = score_max   # 1 for accuracy and R^2; inf for lower-is-better scores
        self.worker = uuid.uuid4().hex
        url, self.path = study_storage(path)
        self.storage = None
        if url is not None:
            kwargs = ({"connect_args": {"timeout": 120}} if url.startswith("sqlite") else
                      {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}})
            # workers starting together race to create optuna's tables and the study: the
            # loser's error (a row or a table the winner wrote, a locked SQLite file) is
            # retried once the winner is done; other errors are not
            for attempt in range(_CREATE_ATTEMPTS):
                try:
                    self.storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
                    self.study = optuna.create_study(
                        study_name=STUDY_NAME, storage=self.storage, load_if_exists=True,
                        directions=["minimize", "minimize"], sampler=sampler)
                    break
                except Exception as exc:  # noqa: BLE001 - sqlalchemy/drivers raise many types
                    if not _lost_creation_race(exc) or attempt == _CREATE_ATTEMPTS - 1:
                        raise _storage_error(self.path, exc) from None
                    self.storage = None
                    time.sleep(0.2 * (attempt + 1))
        try:
            if self.storage is None:
                self.study = optuna.create_study(
                    study_name=STUDY_NAME, storage=None, directions=["minimize", "minimize"],
                    sampler=sampler)
        except Exception as exc:  # noqa: BLE001 - sqlalchemy/optuna raise many types
            raise _storage_error(self.path, exc) from None
        stored = self.study.user_attrs.get("fingerprint")
        if stored is not None and not (isinstance(stored, dict)
                                       and all(isinstance(k, str) for k in stored)):
            raise self._tampered("the study's fingerprint", stored, "an object of named parts")
        if stored is None:
            self.study.set_user_attr("fingerprint", fingerprint)
        elif stored != fingerprint:
            differs = sorted(k for k in set(stored) | set(fingerprint)
                             if stored.get(k) != fingerprint.get(k))
            raise GraphswapError(
                f"the study {self.path} belongs to another exploration: its {', '.join(differs)} "
                f"differ(s) from this one's; use another --study (or delete {self.path} to "
                f"start over)")
        self.distributions = {layer: optuna.distributions.CategoricalDistribution(choices)
                              for layer in layers}
        self._beating = None
        self._ownerless = {}   # claim id -> when this worker first saw it without an owner
        if self.storage is not None:
            self._beat()
            self._beating = threading.Event()
            threading.Thread(target=self._heartbeat, args=(self._beating,), daemon=True).start()

    # -- several workers: heartbeats and claims -------------------------------------------------
    def close(self) -> None:
        """Stop the heartbeat (the worker is done)."""
        if self._beating is not None:
            self._beating.set()
            self._beating = None

    def _beat(self) -> None:
        self.study.set_user_attr(f"worker:{self.worker}", time.time())

    def _heartbeat(self, stop) -> None:
        interval = min(HEARTBEAT_SECONDS, self.claim_timeout / 4)
        while not stop.wait(interval):
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - a missed beat is retried; the claims time out
                pass

    def _claim_name(self, name: str, generation: int) -> str:
        digest = hashlib.sha256(name.encode()).hexdigest()[:40]
        return f"{CLAIM_PREFIX}{digest}:{generation}"

    def claim(self, name: str, generation: int = 0) -> bool:
        """True when this worker may measure `name` (an assignment or estimate key): no other
        worker claimed it (generation 0), or this one takes over a stale claim (generation
        n > 0, claimable once).  In memory: always True."""
        if self.storage is None:
            return True
        claim_name = self._claim_name(name, generation)
        try:
            claim_id = self.storage.create_new_study(
                [self.optuna.study.StudyDirection.MINIMIZE], claim_name)
        except self.optuna.exceptions.DuplicatedStudyError:
            return False
        self.storage.set_study_user_attr(claim_id, "worker", self.worker)
        return True

    def claim_is_stale(self, name: str, generation: int) -> bool:
        """Whether the claim of `name` at `generation` is held by a worker silent for
        claim_timeout seconds (or names no worker: it died between claiming and recording)."""
        try:
            claim_id = self.storage.get_study_id_from_name(self._claim_name(name, generation))
        except KeyError:
            return True
        owner = self.storage.get_study_user_attrs(claim_id).get("worker")
        if not isinstance(owner, str):
            # claimed, owner not yet written: a claim being made now looks the same as one whose
            # worker died in between, so it is stale only once it has stayed ownerless for
            # claim_timeout (taking it at once measured an assignment twice on a loaded machine)
            first = self._ownerless.setdefault(claim_id, time.time())
            return time.time() - first > self.claim_timeout
        last = self.study.user_attrs.get(f"worker:{owner}")  # refreshed on every read
        return not isinstance(last, (int, float)) or time.time() - last > self.claim_timeout

    def wait_for(self, names, refresh, done, on_stale, poll: float = 0.5) -> None:
        """Wait until done(name) for every one of `names` (claimed by other workers), calling
        refresh() before each look; a claim whose worker stopped beating is taken over:
        on_stale(name) measures and records it here."""
        generations = {name: 0 for name in names}
        while True:
            refresh()
            missing = [name for name in names if not done(name)]
            if not missing:
                return
            for name in missing:
                generation = generations[name]
                if self.claim_is_stale(name, generation):
                    generations[name] = generation + 1
                    if self.claim(name, generation + 1):
                        on_stale(name)
            time.sleep(poll)

    def running_trials(self) -> list:
        """The trials being measured now (by any worker; or left by a killed one)."""
        return self.study.get_trials(deepcopy=False,
                                     states=[self.optuna.trial.TrialState.RUNNING])

    # -- full evaluations ---------------------------------------------------------------------
    def measured(self) -> dict:
        """{assignment key: metrics} of every completed evaluation."""
        found = {}
        for trial in self.study.get_trials(deepcopy=False,
                                           states=[self.optuna.trial.TrialState.COMPLETE]):
            if "accuracy" not in trial.user_attrs or trial.user_attrs.get("repeat"):
                continue
            where = f"trial {trial.number}"
            for layer in self.layers:
                if trial.params.get(layer) not in self.choices:
                    raise self._tampered(f"{where}'s circuit for layer {layer!r}",
                                         trial.params.get(layer),
                                         f"one of {', '.join(map(str, self.choices))}")
            key = tuple(trial.params[layer] for layer in self.layers)
            metrics = dict(trial.user_attrs)
            self._check_metrics(metrics, where, ("cost",))
            found[key] = metrics
        return found

    def record(self, assignment: dict, metrics: dict, cost: float) -> None:
        trial = self.optuna.trial.create_trial(
            params=dict(assignment), distributions=self.distributions,
            values=[metrics["drop"], cost], user_attrs={**metrics, "cost": cost})
        self.study.add_trial(trial)

    # -- estimates and fine-tuning ------------------------------------------------------------
    def get(self, key: str):
        """A stored estimate or fine-tuned measurement, checked to be what graphswap writes
        (`put`): "estimates" {layer: {circuit: accuracy}}, "estimate_all_exact" an accuracy,
        "finetuned:..." the metrics of a measurement."""
        value = self.study.user_attrs.get(key)
        if value is None:
            return None
        if key == "estimate_all_exact":
            self._check_number(value, -math.inf, self.score_max, "the stored all-exact estimate")
        elif key == "estimates":
            self._check_estimates(value)
        elif key.startswith("finetuned:"):
            if not isinstance(value, dict):
                raise self._tampered(f"the stored {key!r}", value, "an object of metrics")
            self._check_metrics(value, f"the stored {key!r}")
        return value

    def estimates(self) -> dict:
        """{layer: {circuit: accuracy}} of the stored estimates: one study attribute per pair
        (`put_estimate`; several workers write them), and the single "estimates" object older
        studies hold."""
        merged = {layer: dict(row) for layer, row in (self.get("estimates") or {}).items()}
        for key, value in self.study.user_attrs.items():
            if not key.startswith("estimate:"):
                continue
            try:
                layer, name = load_json(key[len("estimate:"):], "an estimate's key")
            except (ValueError, TypeError, InputFileError):
                raise self._tampered("an estimate's key", key, 'estimate:["layer", "circuit"]') \
                    from None
            self._check_estimates({layer: {name: value}})
            merged.setdefault(layer, {})[name] = value
        return merged

    @staticmethod
    def estimate_key(layer: str, name: str) -> str:
        return "estimate:" + json.dumps([layer, name])

    def _check_estimates(self, value) -> None:
        if not isinstance(value, dict):
            raise self._tampered("the stored estimates", value,
                                 "an object {layer: {circuit: accuracy}}")
        for layer, row in value.items():
            if layer not in self.layers or not isinstance(row, dict):
                raise self._tampered("the stored estimates", {layer: row},
                                     f"rows for the layers {', '.join(self.layers)}, each "
                                     f"an object {{circuit: accuracy}}")
            for name, accuracy in row.items():
                if name not in self.choices:
                    raise self._tampered(f"the estimate of layer {layer!r}", name,
                                         f"one of {', '.join(map(str, self.choices))}")
                self._check_number(accuracy, -math.inf, self.score_max,
                                   f"the estimate of layer {layer!r} on {name}")

    # -- checks of what the database holds ----------------------------------------------------
    def _tampered(self, what, value, allowed):
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return GraphswapError(
            f"the study {self.path} holds a value graphswap did not write: {what} is {shown}; "
            f"expected {allowed}. The file was edited or written by another program: delete it "
            f"(or use another --study file) to measure again")

    def _check_number(self, value, low, high, what, finite=True, optional=False):
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (finite and not math.isfinite(value)) or \
                (math.isfinite(value) and not low <= value <= high):
            allowed = (f"a number in [{low:g}, {high:g}]" if math.isfinite(low) else
                       f"a number up to {high:g}" if math.isfinite(high) else "a number")
            raise self._tampered(what, value, allowed + (" or null" if optional else ""))

    def _check_metrics(self, metrics: dict, where: str, extra=()):
        # "accuracy" is the task's score: an accuracy, or R^2 for regression (at most 1)
        self._check_number(metrics.get("accuracy"), -math.inf, self.score_max,
                           f"{where}'s accuracy")
        self._check_number(metrics.get("drop"), -math.inf, math.inf, f"{where}'s drop")
        # a loss or an output difference may be NaN/inf for a broken model, or absent
        for name in ("loss", "agreement"):
            self._check_number(metrics.get(name), -math.inf, math.inf, f"{where}'s {name}",
                               finite=False, optional=True)
        for name in extra:
            self._check_number(metrics.get(name), 0.0, math.inf, f"{where}'s {name}")

    def put(self, key: str, value) -> None:
        self.study.set_user_attr(key, value)
