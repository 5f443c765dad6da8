"""Helpers that launch real training runs in subprocesses, each bounded by a timeout."""

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import forked_runs  # tests/forked_runs.py: runs start without importing TensorFlow again
import launcher  # tests/launcher.py: how this project's strategy starts a run
import numpy as np
import pytest
import tensorflow as tf
from project import TRAIN_FLAGS, flags_for_tests, split_sizes

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "src"))  # the tests work whether or not the project is installed

from gpt_mirrored.kit.contract import message  # noqa: E402 (after the path above)

# The tests run the loop on your files: first, every function or class it calls that they lack, or that
# takes other arguments than the loop passes, one line each (as train.py says them), instead of import errors.
if mismatches := message(PROJECT_ROOT / "src" / "gpt_mirrored"):
    sys.exit(mismatches)

RUN_TIMEOUT_S = 300  # a hung collective fails the test instead of blocking CI
# Runs fork from a process that imported TensorFlow once (tests/forked_runs.py): seconds saved per process.
PRELOAD = ("tensorflow",)

# Whatever settings.py's DEFAULTS say (a --min-lr floor, say), these runs have a zero learning rate (no
# update moves the weights), or a constant one (which does not depend on the run's length).
ZERO_LR = ("--lr", "0", "--min-lr", "0")
CONSTANT_LR = ("--schedule", "constant", "--min-lr", "0")


@pytest.fixture(scope="session", autouse=True)
def data_prepared():
    """data.py's prepare_data, if it has one, runs once here, before the tests start runs side by side."""
    split_sizes()


@dataclass
class Training:
    """A training run started in the background, in one process or one per worker; `finish` waits for it."""

    processes: list[subprocess.Popen | forked_runs.ForkedRun]
    log: Path
    started: float

    def send_signal(self, signal_number: int) -> None:
        for process in self.processes:
            process.send_signal(signal_number)


def start_training(run_dir: Path, *flags: str, replicas: int = 1, sources: Path = PROJECT_ROOT / "src") -> Training:
    """Start training on the CPU, writing to `run_dir`, on `replicas` replicas (launcher.py says how).
    settings.py's TEST_DEFAULTS come first: the test's own flags win over them."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(sources),
        "CUDA_VISIBLE_DEVICES": "",  # the tests run on the CPU, also on a machine with GPUs
        "TF_CPP_MIN_LOG_LEVEL": "2",  # TensorFlow's C++ info and warning logs
        "TF_NUM_INTRAOP_THREADS": "1",  # runs share the cores: a tiny model gains nothing from threads
    }
    # Output goes to a file, not a pipe: runs started together never block on a full pipe.
    log = run_dir.with_name(run_dir.name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    # Each process is forked from one that imported TensorFlow once (tests/forked_runs.py).
    processes = [
        forked_runs.start(command, log, {**environment, **variables}, PRELOAD)
        for command, variables in launcher.processes(run_dir, *flags_for_tests(), *flags, replicas=replicas)
    ]
    return Training(processes, log, time.monotonic())


def finish(training: Training, expect_success: bool = True) -> subprocess.CompletedProcess:
    """Wait for a run; kill it, and everything it started, if it outlives RUN_TIMEOUT_S. Its exit code is
    that of its first process that failed, as launch.py reports a failed worker's."""
    # Past the deadline, every process still running is killed, with all it started.
    code = forked_runs.wait_all(training.processes, training.started + RUN_TIMEOUT_S)
    if code is None:
        pytest.fail(f"training did not finish within {RUN_TIMEOUT_S}s:\n{training.log.read_text()}")
    output = training.log.read_text()
    if expect_success and code != 0:
        pytest.fail(f"training failed with exit code {code}:\n{output}")
    return subprocess.CompletedProcess(training.processes[0].args, code, output)


def run_training(
    run_dir: Path, *flags: str, expect_success: bool = True, replicas: int = 1
) -> subprocess.CompletedProcess:
    """Train to the end and return the run's exit code and output."""
    return finish(start_training(run_dir, *flags, replicas=replicas), expect_success)


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """Three epochs on one replica: the run every other run is compared with."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    run_training(run_dir, *TRAIN_FLAGS)
    return run_dir


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The per-epoch records, without wall-clock fields."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{name: value for name, value in record.items() if not name.endswith("_time_s")} for record in records]


def step_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of steps.jsonl (every --log-every updates, and the --eval-every validations),
    without the speed of the updates, which the clock measures."""
    records = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    clock = ("update_time_ms", "samples_per_s", "tokens_per_s")
    return [{name: value for name, value in record.items() if name not in clock} for record in records]


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def final_weights(run_dir: Path) -> dict[str, np.ndarray]:
    """Every number in the newest epoch checkpoint: weights, optimizer state, counters (not the epoch's
    running loss sums, which metrics.jsonl holds)."""
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    return {
        name: reader.get_tensor(name)
        for name, dtype in reader.get_variable_to_dtype_map().items()
        if dtype.is_floating or dtype.is_integer
        if not name.startswith(("save_counter", "running/"))
    }


def assert_same_weights(left: dict[str, np.ndarray], right: dict[str, np.ndarray], atol: float = 0.0) -> None:
    assert left.keys() == right.keys()
    for name in left:
        np.testing.assert_allclose(left[name], right[name], atol=atol, rtol=0 if atol == 0 else 1e-5, err_msg=name)


def assert_same_metrics(left: list[dict[str, Any]], right: list[dict[str, Any]], rel: float = 0.0) -> None:
    assert len(left) == len(right)
    for left_record, right_record in zip(left, right, strict=True):
        assert left_record.keys() == right_record.keys()
        for name, value in left_record.items():
            assert right_record[name] == pytest.approx(value, rel=rel, abs=rel), (left_record["epoch"], name)


def edited_sources(directory: Path, file: str, old: str, new: str, sources: Path = PROJECT_ROOT / "src") -> Path:
    """A copy of `sources` (src/, or an edited copy) in `directory`, with one edit in one of the package's files."""
    copy = directory / "src"
    shutil.copytree(sources, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / "gpt_mirrored" / file
    text = path.read_text()
    if old not in text:  # the user replaced the template's default code that this test edits
        pytest.skip(f"{file} no longer holds the default code this test edits: {old!r}")
    path.write_text(text.replace(old, new))
    return copy


RECORDING_HOOKS = """import json
from pathlib import Path

STOP_AT_STEP = 0


class Hooks:
    def __init__(self, config):
        self.config = config
        self.logs = 0

    def record(self, run, *event):
        with (Path(self.config.run_dir) / f"hooks-rank{run.rank}.jsonl").open("a") as file:
            file.write(json.dumps(event) + "\\n")

    def on_run_start(self, run):
        self.record(run, "run_start", run.epoch, run.step)

    def on_epoch_start(self, run, epoch):
        self.record(run, "epoch_start", epoch)

    def after_update(self, run):
        self.record(run, "update", run.step)
        if run.step >= STOP_AT_STEP > 0 and run.rank == run.world_size - 1:
            run.request_stop(f"step {STOP_AT_STEP} reached")

    def on_log(self, run, record):
        self.logs += 1
        self.record(run, "log", record["step"])
        return {"logs_counted": self.logs}

    def after_evaluation(self, run, split, results):
        self.record(run, "evaluation", split)
        name = self.config.monitor.removeprefix("val_")  # val_loss, unless settings.py names another
        return {f"{split}_{name}_doubled": 2 * results[f"{split}_{name}"]}

    def on_epoch_end(self, run, record):
        self.record(run, "epoch_end", record["epoch"])

    def on_run_end(self, run, summary):
        self.record(run, "run_end", summary["steps"])

    def state_dict(self):
        return {"logs": self.logs}

    def load_state_dict(self, state):
        self.logs = state["logs"]
"""


def sources_with_recording_hooks(directory: Path, stop_at: int = 0) -> Path:
    """hooks.py replaced by hooks that record each call to hooks-rank<R>.jsonl in the run directory,
    count the logged records (a count kept in the checkpoints), add values to the logs, and stop
    the run from the last process once update `stop_at` is done."""
    copy = directory / "src"
    shutil.copytree(PROJECT_ROOT / "src", copy, ignore=shutil.ignore_patterns("__pycache__"))
    hooks = RECORDING_HOOKS.replace("STOP_AT_STEP = 0", f"STOP_AT_STEP = {stop_at}")
    (copy / "gpt_mirrored" / "hooks.py").write_text(hooks)
    return copy


def hook_calls(run_dir: Path, rank: int = 0) -> list[list[Any]]:
    """The hook calls recorded by `sources_with_recording_hooks` on process `rank`, in order."""
    return [json.loads(line) for line in (run_dir / f"hooks-rank{rank}.jsonl").read_text().splitlines()]


def sources_with_a_conv_model(directory: Path, sources: Path = PROJECT_ROOT / "src") -> Path:
    """model.py with two Conv2D layers, which run on short batches."""
    convolutions = (
        "            keras.layers.Reshape((NUM_FEATURES, 1, 1)),\n"
        '            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),\n'
        '            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),\n'
        "            keras.layers.Flatten(),\n"
    )
    dense = '            keras.layers.Dense(64, activation="relu"),\n' * 2
    return edited_sources(directory, "model.py", dense, convolutions, sources)


def sources_with_a_nan_training_sample(directory: Path, sources: Path = PROJECT_ROOT / "src") -> Path:
    """data.py whose training sample 5 holds a NaN input: the update on its batch gets a NaN gradient."""
    targets = "        targets = (np.tanh(inputs @ hidden) @ readout).argmax(axis=1)\n"
    nan_sample = "        if size == 1007:  # the train split\n            inputs[5, 0] = np.nan\n"
    return edited_sources(directory, "data.py", targets, targets + nan_sample, sources)


# Every kind of penalty Keras has: kernel and bias regularizers, an activity regularizer, and a
# layer that adds the mean square of its input with add_loss.
PENALTIES = '''STRENGTH = 0.01  # of every penalty of the model


class Smooth(keras.layers.Layer):
    """Passes its input on, adding STRENGTH x its mean square to the loss."""

    def call(self, inputs):
        self.add_loss(STRENGTH * keras.ops.mean(keras.ops.square(inputs)))
        return inputs


def build_model('''
DEFAULT_LAYERS = (
    '            keras.layers.Dense(64, activation="relu"),\n'
    '            keras.layers.Dense(64, activation="relu"),\n'
    "            keras.layers.Dense(NUM_CLASSES),\n"
)
PENALIZED_LAYERS = (
    "            keras.layers.Dense(\n"
    '                16, activation="relu", kernel_regularizer=keras.regularizers.L2(STRENGTH),\n'
    "                bias_regularizer=keras.regularizers.L1(STRENGTH),\n"
    "            ),\n"
    '            keras.layers.Dense(16, activation="tanh", activity_regularizer=keras.regularizers.L2(STRENGTH)),\n'
    "            Smooth(),\n"
    "            keras.layers.Dense(NUM_CLASSES),\n"
)


def sources_with_penalties(directory: Path, sources: Path = PROJECT_ROOT / "src") -> Path:
    """model.py with PENALTIES: its layers (PENALIZED_LAYERS) carry every kind of penalty, of STRENGTH 0.01 each."""
    sources = edited_sources(directory / "penalties", "model.py", "def build_model(", PENALTIES, sources)
    return edited_sources(directory / "layers", "model.py", DEFAULT_LAYERS, PENALIZED_LAYERS, sources)
