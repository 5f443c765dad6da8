"""What the loop checks at each epoch's end: whether it is the best so far (--monitor), and whether to stop
early (--early-stop-patience). Managed by the looptpl template."""

from typing import Any, Literal

from .errors import TrainingError


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
