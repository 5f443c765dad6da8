"""What decides at fixed points of a run: your hooks, and early stopping. Managed by the looptpl template:
edit hooks.py instead.

`Run` is what hooks.py sees of a run. `EarlyStopping` decides whether an epoch is the best so far (--monitor)
and whether to stop early (--early-stop-patience), from figures every process holds alike.
"""

import json
from collections.abc import Callable
from typing import Any, Literal

from flax import nnx

from .config import TrainConfig
from .errors import StepError, TrainingError, user_code_error


class Run:
    """What a hook (hooks.py) sees of the run: read it, call `model()` to use the weights of this moment, and
    call `request_stop` to end the run."""

    def __init__(self, config: TrainConfig, rank: int, world_size: int, model: Callable[[], nnx.Module]) -> None:
        self.config = config
        self.rank = rank  # this process's index (jax.process_index())
        self.world_size = world_size  # the run's processes
        self.is_main = rank == 0  # the process that logs and writes files
        self.epoch = 0  # epochs completed
        self.step = 0  # optimizer updates applied
        self.stop_reason = ""  # set by request_stop
        self._model = model

    def model(self) -> nnx.Module:
        """The model with the weights of this moment, in eval mode, to call as eval_step does (predictions to
        log, a probe); in after_evaluation, the weights evaluated (the best epoch's, for a final test of them).
        Changing it changes nothing in training; the next update reuses its arrays' memory, so call `model()`
        again after one."""
        return self._model()

    def request_stop(self, reason: str) -> None:
        """End the run: at this epoch's end from on_epoch_end, else at the next --log-every updates, where the
        epoch ends early. Any process may ask: every one stops at the same update. The run then tests and
        writes its summary, as after early stopping."""
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


class EarlyStopping:
    """Tracks the best value of the monitored metric (--monitor) and counts epochs without improvement."""

    def __init__(self, monitor: str, mode: Literal["min", "max"], patience: int) -> None:
        self.monitor = monitor
        self.mode = mode
        self.patience = patience  # 0: never stop early, but still track the best epoch
        self.best: float | None = None
        self.best_epoch = 0
        self.best_validation: dict[str, float] = {}  # the best epoch's val figures: the summary's without a test set
        self.epochs_without_improvement = 0

    def update(self, record: dict[str, Any], epoch: int) -> bool:
        """Record one epoch's metrics; return whether its monitored value is the best so far."""
        if self.monitor not in record:
            logged = ", ".join(name for name in record if name.startswith(("train_", "val_")))
            raise TrainingError(f"--monitor {self.monitor} is not a logged metric; choose one of {logged}")
        value = record[self.monitor]
        improved = self.best is None or (value < self.best if self.mode == "min" else value > self.best)
        if improved:
            self.best, self.best_epoch, self.epochs_without_improvement = value, epoch, 0
            self.best_validation = {name: value for name, value in record.items() if name.startswith("val_")}
        else:
            self.epochs_without_improvement += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.epochs_without_improvement >= self.patience

    def state_dict(self) -> dict[str, Any]:
        best = {"best": self.best, "best_epoch": self.best_epoch, "best_validation": self.best_validation}
        return {**best, "bad_epochs": self.epochs_without_improvement}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.best_validation = state.get("best_validation", {})  # checkpoints before it had none
        self.epochs_without_improvement = state["bad_epochs"]
