"""What decides at fixed points of a run: your hooks, early stopping and the NaN policy.

Managed by the looptpl template: edit hooks.py instead. `Run` is what hooks.py sees of a run.
`EarlyStopping` and `NonFiniteGuard` run on every rank with the same all-reduced values, so every
rank takes the same decision. The logs are in logs.py.
"""

from dataclasses import dataclass
from typing import Any, Literal

from .config import TrainConfig
from .errors import StepError, TrainingError, user_code_error


@dataclass
class Run:
    """What a hook (hooks.py) sees of the run: read it, and call `request_stop` to end the run."""

    config: TrainConfig
    models: Any  # what model.py built: one module or the dict of them, wrapped for the strategy (distributed.py)
    optimizers: Any  # what optim.py built: one optimizer or the dict of them
    schedulers: Any  # optim.py's learning-rate schedules, alike: one or the dict of them
    rank: int
    world_size: int
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer updates applied
    stop_reason: str = ""  # set by request_stop

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one that logs and writes files."""
        return self.rank == 0

    @property
    def lr(self) -> float:
        """The learning rate of the (first) optimizer's first parameter group, as the logs show it."""
        optimizer = self.optimizers if not isinstance(self.optimizers, dict) else next(iter(self.optimizers.values()))
        return float(optimizer.param_groups[0]["lr"])

    def request_stop(self, reason: str) -> None:
        """End the run: at this epoch's end from on_epoch_end, else at the next --log-every updates,
        where the epoch ends early. Any rank may ask: every rank stops at the same update. The run
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


class NonFiniteGuard:
    """What a NaN/inf gradient does to the run (--nan-policy): stop it, or skip that update.

    A skipped update changes nothing: no weights, no optimizer state, no schedule step. Many
    skips in a row mean the weights themselves have diverged, so the run stops after
    --max-consecutive-skips of them.
    """

    def __init__(self, policy: Literal["stop", "skip"], max_consecutive_skips: int, announce: bool) -> None:
        self.skips_updates = policy == "skip"
        self.max_consecutive_skips = max_consecutive_skips
        self.announce = announce  # rank 0 prints the warnings
        self.consecutive = 0
        self.skipped_this_epoch = 0

    def allow_update(self, gradients_finite: bool, where: str) -> bool:
        """Return whether the update may go ahead; raise when the run should stop instead."""
        if gradients_finite:
            self.consecutive = 0
            return True
        self.consecutive += 1
        self.skipped_this_epoch += 1
        if self.consecutive > self.max_consecutive_skips:
            raise TrainingError(
                f"the gradients were NaN/inf for {self.consecutive} updates in a row ({where}); "
                "the weights have diverged: lower --lr, check your data for NaN/inf, or use --precision fp32"
            )
        if self.announce:
            print(f"warning: NaN/inf gradients at {where}: update skipped", flush=True)
        return False
