"""The run's logs: metrics.jsonl and metrics.csv per epoch, steps.jsonl, TensorBoard, trackers, the console.

Managed by the looptpl template. Only process 0 builds a `MetricLogger` or a `ProgressBar`.
"""

import csv
import dataclasses
import importlib.util
import io
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .config import TrainConfig
from .trackers import open_tracker


class MetricLogger:
    """Writes one record per epoch to metrics.jsonl, metrics.csv, TensorBoard (if installed) and the
    console, and one per --log-every updates to steps.jsonl (and TensorBoard, against the step)."""

    def __init__(self, run_dir: Path, config: TrainConfig) -> None:
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.csv_path = run_dir / "metrics.csv"
        self.steps_path = run_dir / "steps.jsonl"
        self.steps: io.TextIOWrapper | None = None  # steps.jsonl, kept open while the run logs
        self.tensorboard = _tensorboard_writer(run_dir / "tensorboard")
        project = (__package__ or "training").partition(".")[0]
        self.tracker = open_tracker(config.tracker, run_dir, project, dataclasses.asdict(config))

    def keep_until(self, epoch: int, step: int) -> str:
        """On resume, drop the records after the checkpoint (epoch `epoch`, update `step`): they are logged again.

        Each file is written anew under another name and renamed into place: a crash meanwhile leaves
        the old file or the new one, never less. Returns what is wrong with a damaged log, or "".
        """
        self.close_steps()
        try:
            records = [record for record in self.records() if record["epoch"] <= epoch]
            steps = [record for record in _read_jsonl(self.steps_path) if record["step"] <= step]
        except ValueError as error:
            return str(error)
        _replace(self.jsonl_path, "".join(json.dumps(record) + "\n" for record in records))
        _replace(self.steps_path, "".join(json.dumps(record) + "\n" for record in steps))
        table = io.StringIO(newline="")
        for number, record in enumerate(records):
            _write_row(table, record, header=number == 0)
        _replace(self.csv_path, table.getvalue())
        return ""

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
        if self.steps is None:  # opened once: opening it for each record took as long as 10 updates of a small model
            self.steps = self.steps_path.open("a")
        self.steps.write(json.dumps(record) + "\n")
        self.steps.flush()  # in the file as soon as it is logged, as if it were closed
        if self.tensorboard is not None:
            for name, value in record.items():
                if name not in ("epoch", "step"):
                    self.tensorboard.add_scalar(f"steps/{name}", value, record["step"])
        self.tracker.log({f"steps/{name}": value for name, value in _numbers(record).items()}, record["step"])
        if any(name.startswith("val_") for name in record):
            print("  ".join(_format(name, value) for name, value in record.items()), flush=True)

    def close(self, summary: dict[str, Any]) -> None:
        """End the logs with the run's summary (its test results)."""
        self.close_steps()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.tracker.close(_numbers(summary))

    def close_steps(self) -> None:
        if self.steps is not None:
            self.steps.close()
            self.steps = None

    def _append(self, record: dict[str, Any]) -> None:
        with self.jsonl_path.open("a") as jsonl:
            jsonl.write(json.dumps(record) + "\n")
        new_table = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
        with self.csv_path.open("a", newline="") as table:
            _write_row(table, record, header=new_table)


T = TypeVar("T")  # what `counting` passes through


class ProgressBar:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal:
    `epoch 2/3 [##########..............] 72/126  loss 0.2773  116 samples/s  0:12 left 0:09`."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.started = time.perf_counter()

    def start(self, epoch: int, epochs: int, total: int, first: int = 0) -> None:
        """An epoch of `total` updates begins, at update `first` (after a resume part-way through it)."""
        self.epoch, self.epochs, self.total, self.first = epoch, epochs, total, first
        self.started = time.perf_counter()
        self.shown, self.losses, self.updates = first, 0.0, 0  # for the epoch's running mean of the loss

    def update(self, done: int, samples: int, loss: float) -> None:
        """`done` updates of the epoch are done, `samples` of them trained since it (re)started; `loss`
        is the mean of the updates since the last call. The bar shows the epoch's running mean."""
        if not self.enabled:
            return
        if math.isfinite(loss):  # a window of skipped updates (--nan-policy skip) has no loss to add
            self.losses, self.updates = self.losses + loss * (done - self.shown), self.updates + done - self.shown
        self.shown, loss = done, self.losses / self.updates if self.updates else loss
        elapsed = max(1e-9, time.perf_counter() - self.started)
        left = elapsed * (self.total - done) / max(1, done - self.first)
        loss_text = f"{loss:.4f}" if math.isfinite(loss) else str(loss)
        figures = f"{done}/{self.total}  loss {loss_text}  {samples / elapsed:,.0f} samples/s"
        figures += f"  {_clock(elapsed)} left {_clock(left)}"
        head = f"epoch {self.epoch}/{self.epochs} "
        # The bar takes what the terminal has left, up to 24 characters; a line never wraps.
        columns = shutil.get_terminal_size().columns
        width = min(24, columns - 1 - len(head) - len(figures) - 3)
        filled = max(0, width) * done // max(1, self.total)
        bar = f"[{'#' * filled}{'.' * (width - filled)}] " if width >= 8 else ""
        sys.stderr.write(f"\r{(head + bar + figures)[: columns - 1]}\033[K")  # \033[K: clear a longer line's rest
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()

    def counting(self, what: str, batches: Iterable[T]) -> Iterator[T]:
        """`batches`, drawing `validating: 12 batches  0:03` as they go by (a few times a second)."""
        if not self.enabled:
            yield from batches
            return
        started = shown = time.perf_counter()
        for count, batch in enumerate(batches, 1):
            yield batch
            if (now := time.perf_counter()) - shown > 0.2:
                sys.stderr.write(f"\r{what}: {count} batches  {_clock(now - started)}\033[K")
                sys.stderr.flush()
                shown = now
        self.finish()


class UpdateSpeed:
    """The speed of the updates between two steps.jsonl records, on any device. The host clock
    measures them exactly where the loop has just waited for the device (to read the loss)."""

    def restart(self, done: int, samples: int) -> None:
        """Start a stretch after update `done` of the epoch, `samples` into it."""
        self.started, self.done, self.samples = time.perf_counter(), done, samples

    def figures(self, done: int, samples: int) -> dict[str, float]:
        """Time per update and samples/s of the stretch that ends after update `done`, `samples` into the
        epoch; its length stays in `seconds`, for other rates of the same stretch."""
        self.seconds = seconds = max(time.perf_counter() - self.started, 1e-9)
        per_update = 1000 * seconds / max(done - self.done, 1)
        return {"update_time_ms": round(per_update, 2), "samples_per_s": round((samples - self.samples) / seconds, 1)}


def _clock(seconds: float) -> str:
    """3725 s -> 1:02:05; 65 s -> 1:05."""
    minutes, second = divmod(round(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}:{minute:02d}:{second:02d}" if hours else f"{minute}:{second:02d}"


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    """What a tracker logs of a record: its numbers but the update count, which is their x axis."""
    numbers = {name: value for name, value in record.items() if isinstance(value, int | float)}
    return {name: value for name, value in numbers.items() if name != "step" and not isinstance(value, bool)}


def _write_row(table: Any, record: dict[str, Any], header: bool) -> None:
    writer = csv.DictWriter(table, fieldnames=list(record))
    if header:
        writer.writeheader()
    writer.writerow(record)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a log, one JSON object a line; a ValueError names a damaged line.

    A last line without its newline was cut short (by a kill, or a full disk): it is dropped, with a
    warning, unless it is whole.
    """
    if not path.exists():
        return []
    *lines, last = path.read_bytes().split(b"\n")
    records = [_record(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if last.strip():
        try:
            records.append(_record(path, len(lines) + 1, last))
        except ValueError:
            print(f"warning: {path}: dropped its last line, cut short when the run stopped", flush=True)
    return records


def _record(path: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError as error:  # not UTF-8, or not JSON
        raise ValueError(f"{path}:{number} is damaged ({error}); delete that line or restore the file") from None
    if not isinstance(record, dict) or not isinstance(record.get("epoch"), int):
        raise ValueError(f"{path}:{number} is damaged (not a record of this run); delete that line or restore the file")
    return record


def _replace(path: Path, text: str) -> None:
    """Write `path` anew in one step: to a temporary file, flushed to disk, then renamed over it."""
    written = path.with_name(path.name + ".tmp")
    try:
        with written.open("w", newline="") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(written, path)
    finally:
        written.unlink(missing_ok=True)


def _tensorboard_writer(log_dir: Path) -> Any:
    """A SummaryWriter when tensorboardX is installed (`pip install tensorboardX`), else None: JAX brings
    no TensorBoard writer of its own."""
    if importlib.util.find_spec("tensorboardX") is None:
        return None
    from tensorboardX import SummaryWriter

    return SummaryWriter(str(log_dir))


def _format(name: str, value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.3e}" if name == "lr" or (value != 0 and abs(value) < 1e-3) else f"{value:.4f}"
        return f"{name} {text}"
    return f"{name} {value}"
