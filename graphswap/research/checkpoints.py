"""Fine-tuning checkpoints: a directory holding `last.keras` (weights and optimizer state after the
latest epoch), `best.keras` (best weights so far) and `state.json` (epochs done, monitor, best
value, history, the run's settings, the run's fingerprint and the random-number state - see
graphswap.research.fingerprints), written atomically after every epoch by CheckpointTracker."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import keras

from graphswap.errors import GraphswapError
from graphswap.research.fingerprints import rng_state

CHECKPOINT_STATE = "state.json"
CHECKPOINT_LAST = "last.keras"
CHECKPOINT_BEST = "best.keras"


def _write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def _save_model_atomic(model, path: Path) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.keras")
    model.save(tmp)
    os.replace(tmp, path)


def read_checkpoint_state(directory) -> dict | None:
    path = Path(directory) / CHECKPOINT_STATE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        int(state["epoch"])
    except (ValueError, KeyError, TypeError) as exc:
        raise GraphswapError(f"checkpoint state {path} is unreadable ({exc}); delete the "
                             f"directory to start over") from None
    return state


def _is_better(value, best, mode) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if best is None:
        return True
    return value > best if mode == "max" else value < best


class CheckpointTracker(keras.callbacks.Callback):
    """Tracks the monitor, keeps the best weights, stops early, and writes the checkpoints."""

    def __init__(self, monitor, patience, directory, chief, state, run_config, fingerprint=None):
        super().__init__()
        self.requested_monitor = monitor
        self.monitor = monitor
        self.mode = None
        self.patience = patience
        self.directory = Path(directory) if directory else None
        self.chief = chief
        self.history = {k: list(v) for k, v in (state or {}).get("history", {}).items()}
        self.best = (state or {}).get("best_value")
        self.best_epoch = (state or {}).get("best_epoch")
        self.best_weights = None
        self.wait = 0
        self.stopped_early = False
        self.epochs_run: list[int] = []
        self.run_config = run_config
        self.fingerprint = fingerprint
        if state and state.get("monitor"):
            self.monitor = state["monitor"]

    def _resolve_monitor(self, logs):
        if self.monitor is not None:
            if self.monitor not in logs:
                raise GraphswapError(
                    f"monitor {self.monitor!r} is not among the training logs "
                    f"({', '.join(sorted(logs))})")
        else:
            keys = sorted(logs)
            accuracy = [k for k in keys if k.startswith("val_") and "acc" in k]
            if accuracy:
                self.monitor = accuracy[0]
            elif "val_loss" in logs:
                self.monitor = "val_loss"
            else:
                train_accuracy = [k for k in keys if "acc" in k]
                self.monitor = train_accuracy[0] if train_accuracy else "loss"
        self.mode = "max" if "acc" in self.monitor else "min"

    def on_epoch_end(self, epoch, logs=None):
        logs = {k: float(v) for k, v in (logs or {}).items()}
        if self.mode is None:
            self._resolve_monitor(logs)
        for key, value in logs.items():
            self.history.setdefault(key, []).append(value)
        self.history.setdefault("epoch", []).append(epoch + 1)
        self.epochs_run.append(epoch + 1)
        value = logs.get(self.monitor)
        if _is_better(value, self.best, self.mode):
            self.best, self.best_epoch, self.wait = value, epoch + 1, 0
            self.best_weights = self.model.get_weights()
            if self.directory and self.chief:
                _save_model_atomic(self.model, self.directory / CHECKPOINT_BEST)
        else:
            self.wait += 1
        if self.directory and self.chief:
            _save_model_atomic(self.model, self.directory / CHECKPOINT_LAST)
            _write_json_atomic(self.directory / CHECKPOINT_STATE, {
                "epoch": epoch + 1, "monitor": self.monitor, "mode": self.mode,
                "best_value": self.best, "best_epoch": self.best_epoch,
                "history": self.history, "config": self.run_config,
                "fingerprint": self.fingerprint, "rng": rng_state(self.model)})
        if self.patience is not None and self.wait >= self.patience:
            self.stopped_early = True
            self.model.stop_training = True
