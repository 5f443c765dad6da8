"""Early stopping, the NaN policy, metric logs and the progress bar. Managed by the looptpl template.

Only rank 0 builds a `MetricLogger` or a `ProgressBar`. `EarlyStopping` and `NonFiniteGuard` run
on every rank with the same all-reduced values, so every rank takes the same decision.
"""

import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Literal

from .errors import TrainingError


class EarlyStopping:
    """Tracks the best value of the monitored metric and counts epochs without improvement."""

    def __init__(self, mode: Literal["min", "max"], patience: int) -> None:
        self.mode = mode
        self.patience = patience  # 0: never stop early, but still track the best epoch
        self.best: float | None = None
        self.best_epoch = 0
        self.epochs_without_improvement = 0

    def update(self, value: float, epoch: int) -> bool:
        """Record one epoch's value; return whether it is the best so far."""
        improved = self.best is None or (value < self.best if self.mode == "min" else value > self.best)
        if improved:
            self.best, self.best_epoch, self.epochs_without_improvement = value, epoch, 0
        else:
            self.epochs_without_improvement += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.epochs_without_improvement >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "bad_epochs": self.epochs_without_improvement}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]
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


class MetricLogger:
    """Writes one record per epoch to metrics.jsonl, metrics.csv, TensorBoard (if installed) and the console."""

    def __init__(self, run_dir: Path) -> None:
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.csv_path = run_dir / "metrics.csv"
        self.tensorboard = _tensorboard_writer(run_dir / "tensorboard")

    def keep_until(self, epoch: int) -> None:
        """On resume, drop records of epochs after the checkpoint, which will be trained again."""
        records = self.records()
        self.jsonl_path.unlink(missing_ok=True)
        self.csv_path.unlink(missing_ok=True)
        for record in records:
            if record["epoch"] <= epoch:
                self._append(record)

    def records(self) -> list[dict[str, Any]]:
        """Every record logged so far."""
        if not self.jsonl_path.exists():
            return []
        return [json.loads(line) for line in self.jsonl_path.read_text().splitlines() if line]

    def log(self, record: dict[str, Any]) -> None:
        self._append(record)
        if self.tensorboard is not None:
            for name, value in record.items():
                if name not in ("epoch", "step"):
                    self.tensorboard.add_scalar(name, value, record["epoch"])
            self.tensorboard.flush()
        print("  ".join(_format(name, value) for name, value in record.items()), flush=True)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()

    def _append(self, record: dict[str, Any]) -> None:
        with self.jsonl_path.open("a") as jsonl:
            jsonl.write(json.dumps(record) + "\n")
        new_file = not self.csv_path.exists()
        with self.csv_path.open("a", newline="") as table:
            writer = csv.DictWriter(table, fieldnames=list(record))
            if new_file:
                writer.writeheader()
            writer.writerow(record)


def _tensorboard_writer(log_dir: Path) -> Any:
    """A SummaryWriter when TensorBoard is installed (`pip install tensorboard`), else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(log_dir=str(log_dir))


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
