"""What the tests read from your project: its settings, its data's sizes, the names of its losses.

The tests compare runs with what your settings.py and data.py make of them, not with the
template's placeholder numbers, so they keep testing your project once you have filled it in.
"""

import functools
import json
import math
from pathlib import Path
from typing import Any


@functools.cache
def project_settings() -> Any:
    """The project's TrainConfig as a run without flags gets it: settings.py's values over the template's."""
    from gpt_ddp.kit.config import parse_config  # imported here, once src/ is on the path

    return parse_config([])


@functools.cache
def split_sizes() -> tuple[int, ...]:
    """The numbers of samples in the (train, validation, test) splits that data.py builds."""
    from gpt_ddp.data import build_datasets

    return tuple(len(split) for split in build_datasets(project_settings()))


def updates_per_epoch(global_batch_size: int | None = None) -> int:
    """Optimizer updates in an epoch of the project's data; the short last global batch is kept."""
    return math.ceil(split_sizes()[0] / (global_batch_size or project_settings().global_batch_size))


def resumed_message(updates: int, global_batch_size: int | None = None) -> str:
    """What a run resumed from a checkpoint written after update `updates` prints."""
    per_epoch = updates_per_epoch(global_batch_size)
    epochs, update = divmod(updates, per_epoch)
    if update:
        return f"resumed after update {updates}, part-way through epoch {epochs + 1} (update {update} of {per_epoch})"
    return f"resumed after update {updates}, the end of epoch {epochs}"


def monitored_improved(records: list[dict[str, Any]]) -> bool:
    """Whether the --monitor metric (val_loss, unless settings.py names another) ended better than epoch 1."""
    settings = project_settings()
    first, last = records[0][settings.monitor], records[-1][settings.monitor]
    return bool(last < first) if settings.monitor_mode == "min" else bool(last > first)


def losses(record: dict[str, Any]) -> list[str]:
    """The losses a record holds: train_loss and val_loss, or one per optimizer (train_generator_loss)."""
    return [name for name in record if name.endswith("_loss")]


def final_test(run_dir: Path) -> dict[str, Any]:
    """The final test's results in summary.json: test_loss, test_accuracy, test_samples, ..."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return {name: value for name, value in summary.items() if name.startswith("test_")}
