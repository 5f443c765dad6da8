"""The run's logs: metrics.jsonl and metrics.csv per epoch, steps.jsonl, TensorBoard, trackers, the console.

Managed by the looptpl template. Only rank 0 builds a `MetricLogger` or a `ProgressBar`.
"""

import csv
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from .config import TrainConfig
from .trackers import open_tracker


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

    def log(self, record: dict[str, Any]) -> None:
        self._append(record)
        if self.tensorboard is not None:
            for name, value in record.items():
                if name not in ("epoch", "step"):
                    self.tensorboard.add_scalar(name, value, record["epoch"])
            self.tensorboard.flush()
        self.tracker.log(_numbers(record), record["step"])
        print("  ".join(_format(name, value) for name, value in record.items()), flush=True)

    def log_step(self, record: dict[str, Any]) -> None:
        """A record of the updates since the last one; printed when it holds a validation."""
        with self.steps_path.open("a") as jsonl:
            jsonl.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            for name, value in record.items():
                if name not in ("epoch", "step"):
                    self.tensorboard.add_scalar(f"steps/{name}", value, record["step"])
        self.tracker.log({f"steps/{name}": value for name, value in _numbers(record).items()}, record["step"])
        if any(name.startswith("val_") for name in record):
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


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    """What a tracker logs of a record: its numbers but the update count, which is their x axis."""
    numbers = {name: value for name, value in record.items() if isinstance(value, int | float)}
    return {name: value for name, value in numbers.items() if name != "step" and not isinstance(value, bool)}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


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
