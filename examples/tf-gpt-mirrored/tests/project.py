"""What the tests read from your project: its settings, its data's sizes, the names of its losses.

The tests compare runs with what your settings.py and data.py make of them, not with the
template's placeholder numbers, so they keep testing your project once you have filled it in.
Every run they start gets settings.py's TEST_DEFAULTS first (`flags_for_tests`): there a project with a
large corpus keeps its test runs to seconds, with {"eval_batches": 2} say (most runs take TRAIN_FLAGS'
epochs, of 26 updates at most).
"""

import functools
import importlib
import json
import math
from pathlib import Path
from typing import Any

# Most test runs train with these. From the template's data: 1007 training samples = 25 global batches
# of 40 + a last one of 7, and 251 validation samples in batches of 100: short last batches (launcher.py
# says how this project's strategy splits them). A larger train set makes epochs of its first 26
# batches (--steps-per-epoch), as the tests count on.
# With a moving average of the weights (--ema-decay): every comparison of runs compares it too.
TRAIN_FLAGS = (
    *("--epochs", "3", "--global-batch-size", "40", "--steps-per-epoch", "26"),
    *("--eval-batch-size", "100", "--ema-decay", "0.9"),
)


@functools.cache
def flags_for_tests() -> tuple[str, ...]:
    """settings.py's TEST_DEFAULTS as flags: every test run gets them, before the test's own flags."""
    from gpt_mirrored import settings  # imported here, once src/ is on the path
    from gpt_mirrored.kit.config import TrainConfig

    flags: list[str] = []
    for name, value in getattr(settings, "TEST_DEFAULTS", {}).items():  # a settings.py from before it has none
        if name not in TrainConfig.__dataclass_fields__:
            raise ValueError(f"settings.py: TEST_DEFAULTS names {name}, which is no flag (see --help)")
        option = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{option}" if value else f"--no-{option}")
        else:
            flags += [f"--{option}", str(value)]
    return tuple(flags)


@functools.cache
def project_settings() -> Any:
    """The project's TrainConfig as a test run of TRAIN_FLAGS gets it: settings.py's DEFAULTS, then
    TEST_DEFAULTS, then TRAIN_FLAGS."""
    from gpt_mirrored.kit.config import parse_config

    return parse_config([*flags_for_tests(), *TRAIN_FLAGS])


@functools.cache
def split_sizes() -> tuple[int | None, ...]:
    """The numbers of samples in the (train, validation, test) splits that data.py builds (None: no test set),
    after its prepare_data, if it has one, has written what build_datasets reads."""
    data = importlib.import_module("gpt_mirrored.data")
    if hasattr(data, "prepare_data"):
        data.prepare_data(project_settings())
    splits = data.build_datasets(project_settings())
    return tuple(None if split is None else int(split.cardinality()) for split in splits)


def global_batches() -> int:
    """The global batches of the whole train set, the short last one included."""
    return math.ceil(split_sizes()[0] / project_settings().global_batch_size)


def updates_per_epoch() -> int:
    """Optimizer updates in an epoch: the whole train set's global batches, or --steps-per-epoch of them."""
    return min(global_batches(), project_settings().steps_per_epoch or global_batches())


def samples_per_epoch() -> int:
    """Training samples in an epoch: the whole train set, or --steps-per-epoch global batches."""
    return min(split_sizes()[0], updates_per_epoch() * project_settings().global_batch_size)


def evaluated_samples(split: str) -> int:
    """Samples an evaluation of "val" or "test" uses: the whole split, or --eval-batches x --eval-batch-size."""
    size = split_sizes()[("val", "test").index(split) + 1]
    settings = project_settings()
    return min(size, settings.eval_batches * settings.eval_batch_size or size)


def resumed_message(updates: int) -> str:
    """What a run resumed from a checkpoint written after update `updates` prints (TRAIN_FLAGS' epochs)."""
    per_epoch = updates_per_epoch()
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


def final_split() -> str:
    """The split whose figures summary.json gives: "test", or "val" (the best epoch's) without a test set."""
    return "val" if split_sizes()[2] is None else "test"


def final_test(run_dir: Path) -> dict[str, Any]:
    """The final figures in summary.json: test_loss, test_accuracy, test_samples, ... (val_* without a test set)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return {name: value for name, value in summary.items() if name.startswith(f"{final_split()}_")}
