"""Early stopping, metric logs, the progress bar, and what hooks.py sees of a run.

Managed by the looptpl template: edit metrics.py and hooks.py instead.
"""

import csv
import dataclasses
import importlib.util
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tensorflow as tf

from .config import TrainConfig
from .errors import StepError, TrainingError, user_code_error
from .trackers import open_tracker


@dataclass
class Run:
    """What a hook (hooks.py) sees of the run: read it, and call `request_stop` to end the run."""

    config: TrainConfig
    models: Any  # what model.py built: one model or the dict of them
    optimizers: Any  # what optim.py built: one optimizer or the dict of them
    rank: int  # this process's index: the worker's, with multi-worker; else 0
    world_size: int  # the run's processes (workers)
    is_main: bool  # the chief: the process that logs and writes files
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer updates applied
    stop_reason: str = ""  # set by request_stop

    @property
    def lr(self) -> float:
        """The learning rate of the (first) optimizer, as the logs show it."""
        optimizer = self.optimizers if not isinstance(self.optimizers, dict) else next(iter(self.optimizers.values()))
        return float(optimizer.learning_rate)

    def request_stop(self, reason: str) -> None:
        """End the run: at this epoch's end from on_epoch_end, else at the next --log-every updates,
        where the epoch ends early. Any process may ask: every one stops at the same update. The run
        then tests and writes its summary, as after early stopping."""
        self.stop_reason = self.stop_reason or reason


class HookCaller:
    """Calls the methods of hooks.py's `Hooks`: a mistake there is one line naming its file and line,
    and a method that Hooks leaves out does nothing and adds nothing."""

    def __init__(self, hooks_class: type, config: TrainConfig, run: Run) -> None:
        self.run = run
        try:
            self.hooks = hooks_class(config)
        except Exception as error:
            raise user_code_error(error, "building Hooks") from None

    def __call__(self, name: str, *args: Any) -> Any:
        method = getattr(self.hooks, name, None)
        if method is None:
            return {}
        try:
            return method(*args)
        except Exception as error:
            raise user_code_error(error, f"in Hooks.{name}") from None

    def added(self, name: str, *args: Any) -> dict[str, float]:
        """The values hook `name` adds to a record (its last argument), checked to be new names."""
        added = self(name, self.run, *args)
        if not isinstance(added, dict) or any(key in args[-1] for key in added):
            clash = [key for key in added if key in args[-1]] if isinstance(added, dict) else added
            raise StepError(f"hooks.py: {name} must return a dict of new names, got {clash!r}")
        return added

    def state_json(self) -> str:
        """The hooks' `state_dict`, as the JSON a checkpoint stores."""
        try:
            return json.dumps(self("state_dict"))
        except (TypeError, ValueError) as error:
            raise StepError(f"hooks.py: state_dict must return JSON-serializable values ({error})") from None


class EarlyStopping(tf.Module):
    """Tracks the best value of the monitored metric (--monitor) and counts epochs without improvement.

    Its state lives in variables, so the checkpoint carries it and --resume keeps counting.
    """

    def __init__(self, monitor: str, mode: Literal["min", "max"], patience: int) -> None:
        super().__init__(name="early_stopping")
        self.monitor = monitor
        self.mode = mode
        self.patience = patience  # 0: never stop early, but still track the best epoch
        self.best = tf.Variable(math.nan, dtype=tf.float64, trainable=False)  # NaN: nothing seen yet
        self.best_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.bad_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)

    def update(self, record: dict[str, Any], epoch: int) -> bool:
        """Record one epoch's metrics; return whether its monitored value is the best so far."""
        if self.monitor not in record:
            logged = ", ".join(name for name in record if name.startswith(("train_", "val_")))
            raise TrainingError(f"--monitor {self.monitor} is not a logged metric; choose one of {logged}")
        value = record[self.monitor]
        best = float(self.best.numpy())
        improved = math.isnan(best) or (value < best if self.mode == "min" else value > best)
        if improved:
            self.best.assign(value)
            self.best_epoch.assign(epoch)
            self.bad_epochs.assign(0)
        else:
            self.bad_epochs.assign_add(1)
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and int(self.bad_epochs.numpy()) >= self.patience

    def best_value(self) -> float | None:
        best = float(self.best.numpy())
        return None if math.isnan(best) else best


class MetricLogger:
    """Writes one record per epoch to metrics.jsonl, metrics.csv, TensorBoard (if installed) and the
    console, and one per --log-every updates to steps.jsonl (and TensorBoard, against the step)."""

    def __init__(self, run_dir: Path, config: TrainConfig) -> None:
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.csv_path = run_dir / "metrics.csv"
        self.steps_path = run_dir / "steps.jsonl"
        self.tensorboard = _tensorboard_writer(run_dir / "tensorboard")
        self.tracker = open_tracker(config.tracker, run_dir, __package__ or "training", dataclasses.asdict(config))

    def keep_until(self, epoch: int, step: int) -> None:
        """On resume, drop the records after the checkpoint (epoch `epoch`, update `step`): they are logged again."""
        records, steps = self.records(), _read_jsonl(self.steps_path)
        for path in (self.jsonl_path, self.csv_path, self.steps_path):
            path.unlink(missing_ok=True)
        for record in records:
            if record["epoch"] <= epoch:
                self._append(record)
        with self.steps_path.open("a") as jsonl:
            jsonl.writelines(json.dumps(record) + "\n" for record in steps if record["step"] <= step)

    def records(self) -> list[dict[str, Any]]:
        """Every epoch record logged so far."""
        return _read_jsonl(self.jsonl_path)

    def log_step(self, record: dict[str, Any]) -> None:
        """A record of the updates since the last one; printed when it holds a validation."""
        with self.steps_path.open("a") as jsonl:
            jsonl.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            with self.tensorboard.as_default():
                for name, value in record.items():
                    if name not in ("epoch", "step"):
                        tf.summary.scalar(f"steps/{name}", value, step=record["step"])
        self.tracker.log({f"steps/{name}": value for name, value in _numbers(record).items()}, record["step"])
        if any(name.startswith("val_") for name in record):
            print("  ".join(_format(name, value) for name, value in record.items()), flush=True)

    def log(self, record: dict[str, Any]) -> None:
        self._append(record)
        if self.tensorboard is not None:
            with self.tensorboard.as_default():
                for name, value in record.items():
                    if name not in ("epoch", "step"):
                        tf.summary.scalar(name, value, step=record["epoch"])
            self.tensorboard.flush()
        self.tracker.log(_numbers(record), record["step"])
        print("  ".join(_format(name, value) for name, value in record.items()), flush=True)

    def close(self, summary: dict[str, Any]) -> None:
        """End the logs with the run's summary (its test results)."""
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.tracker.close(_numbers(summary))

    def _append(self, record: dict[str, Any]) -> None:
        with self.jsonl_path.open("a") as jsonl:
            jsonl.write(json.dumps(record) + "\n")
        new_file = not self.csv_path.exists()
        with self.csv_path.open("a", newline="") as table:
            writer = csv.DictWriter(table, fieldnames=list(record))
            if new_file:
                writer.writeheader()
            writer.writerow(record)


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    """What a tracker logs of a record: its numbers but the update count, which is their x axis."""
    numbers = {name: value for name, value in record.items() if isinstance(value, int | float)}
    return {name: value for name, value in numbers.items() if name != "step" and not isinstance(value, bool)}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _tensorboard_writer(log_dir: Path) -> Any:
    """A tf.summary writer when TensorBoard is installed (`pip install tensorboard`), else None.

    tf.summary.scalar needs the tensorboard package, which TensorFlow no longer installs itself.
    """
    if importlib.util.find_spec("tensorboard") is None:
        return None
    return tf.summary.create_file_writer(str(log_dir))


def _format(name: str, value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.3e}" if name == "lr" or (value != 0 and abs(value) < 1e-3) else f"{value:.4f}"
        return f"{name} {text}"
    return f"{name} {value}"


class ProgressBar:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.started = time.perf_counter()

    def start(self, epoch: int, epochs: int, total: int) -> None:
        self.epoch, self.epochs, self.total = epoch, epochs, total
        self.started = time.perf_counter()

    def update(self, done: int, samples: int, loss: float) -> None:
        if not self.enabled:
            return
        width = 24
        filled = width * done // max(1, self.total)
        rate = samples / max(1e-9, time.perf_counter() - self.started)
        loss_text = f"{loss:.4f}" if math.isfinite(loss) else str(loss)
        sys.stderr.write(
            f"\repoch {self.epoch}/{self.epochs} [{'#' * filled}{'.' * (width - filled)}] "
            f"{done}/{self.total}  loss {loss_text}  {rate:,.0f} samples/s"
        )
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
