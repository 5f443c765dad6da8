"""What decides at fixed points of a run: your hooks and early stopping.

Managed by the looptpl template: edit hooks.py instead. `Run` is what hooks.py sees of a run.
`EarlyStopping` runs on every worker with the same all-reduced metric values, and the chief's
decision is shared (train.py). The NaN policy is in train.py's TrainStep, the logs in logs.py.
"""

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

import tensorflow as tf

from .config import TrainConfig
from .errors import StepError, TrainingError, user_code_error


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
        """The values hook `name` adds to a record (its last argument), checked to be new names and numbers."""
        added = self(name, self.run, *args)
        if not isinstance(added, dict) or any(key in args[-1] for key in added):
            clash = [key for key in added if key in args[-1]] if isinstance(added, dict) else added
            raise StepError(f"hooks.py: {name} must return a dict of new names, got {clash!r}")
        for key, value in added.items():
            if not isinstance(value, int | float):  # the logs, CSV and trackers hold numbers
                kind = type(value).__name__
                raise StepError(f"hooks.py: {name} must return numbers, got {key!r}: {kind}; return float(...) of it")
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

    def __init__(self, monitor: str, mode: Literal["min", "max"], patience: int, keep_validation: bool) -> None:
        super().__init__(name="early_stopping")
        self.monitor = monitor
        self.mode = mode
        self.patience = patience  # 0: never stop early, but still track the best epoch
        self.best = tf.Variable(math.nan, dtype=tf.float64, trainable=False)  # NaN: nothing seen yet
        self.best_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.bad_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)
        # The best epoch's val figures, the summary's without a test set; only then in the checkpoint, so that
        # a run with a test set resumes from checkpoints written before it existed.
        self.best_validation = BestValidation() if keep_validation else None

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
            if self.best_validation is not None:
                figures = {name: value for name, value in record.items() if name.startswith("val_")}
                self.best_validation.figures = figures
        else:
            self.bad_epochs.assign_add(1)
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and int(self.bad_epochs.numpy()) >= self.patience

    def best_value(self) -> float | None:
        best = float(self.best.numpy())
        return None if math.isnan(best) else best


class BestValidation(tf.train.experimental.PythonState):
    """The best epoch's val figures (name: value), as JSON in the checkpoint."""

    def __init__(self) -> None:
        self.figures: dict[str, float] = {}

    def serialize(self) -> str:
        return json.dumps(self.figures)

    def deserialize(self, string_value: bytes) -> None:
        self.figures = json.loads(string_value)
