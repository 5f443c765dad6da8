"""Helpers that launch real training runs in subprocesses, each bounded by a timeout."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import forked_runs  # tests/forked_runs.py: runs start without importing torch again
import pytest
import torch
from project import flags_for_tests, split_sizes

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "src"))  # the tests work whether or not the project is installed

from digits_ddp.kit.contract import message  # noqa: E402 (after the path above)

# The tests run the loop on your files: first, every function or class it calls that they lack, or that
# takes other arguments than the loop passes, one line each (as train.py says them), instead of import errors.
if mismatches := message(PROJECT_ROOT / "src" / "digits_ddp"):
    sys.exit(mismatches)

from digits_ddp.kit.checkpoint import checkpoints_in, load_whole  # noqa: E402 (your files are checked)

RUN_TIMEOUT_S = 300  # a hung collective fails the test instead of blocking CI
# Every run's processes fork from one that imported these once (tests/forked_runs.py): seconds saved each.
# torch._dynamo is what a torch optimizer imports when it is built: 1.4 CPU-s of a small run's 2.
PRELOAD = ("torch", "torch.distributed.checkpoint.state_dict", "torch._dynamo")

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
    """A run started in the background, in one process or one per rank, writing its output to `log`;
    `finish` waits for it."""

    processes: list[subprocess.Popen | forked_runs.ForkedRun]
    log: Path
    started: float

    def signal_all(self, signal_number: int) -> None:
        """Send a signal to each process still running and all it started, as a terminal's Ctrl-C reaches them."""
        forked_runs.signal_groups(self.processes, signal_number)


STARTED: list[Training] = []  # every run `start` started


@pytest.fixture(scope="module", autouse=True)
def stop_runs_left_running():
    """A test that fails while runs it started are still going leaves them behind: stop them."""
    yield
    for training in STARTED:
        training.signal_all(signal.SIGKILL)  # the whole groups: each rank, or torchrun and every rank
    STARTED.clear()


def torchrun(ranks: int) -> tuple[str, ...]:
    """torchrun on this machine: the tests of what torchrun itself does (restarts, stopping the other ranks)
    run under it; the other runs of several ranks start the ranks themselves (`rank_variables`)."""
    # --standalone picks a free rendezvous port, so parallel test runs never clash.
    return (sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}")


def training_command(run_dir: Path, *flags: str, launcher: tuple[str, ...] = ()) -> list[str]:
    """The command that trains into `run_dir`: plain python, or under `launcher` (torchrun, say).
    settings.py's TEST_DEFAULTS come first: the test's own flags win over them."""
    module = ["-m", "digits_ddp.train", "--run-dir", str(run_dir), "--device", "cpu", "--no-progress"]
    return [*(launcher or [sys.executable]), *module, *flags_for_tests(), *flags]


def rank_variables(ranks: int) -> list[dict[str, str]]:
    """The environment variables torchrun gives each of `ranks` processes on one machine (none for one
    process): where rank 0 hosts the rendezvous, each rank's number, and how many there are."""
    if ranks == 1:
        return [{}]
    world = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(forked_runs.free_port()), "WORLD_SIZE": str(ranks)}
    world["LOCAL_WORLD_SIZE"] = str(ranks)
    return [{**world, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(ranks)]


def start(
    command: list[str], log: Path, sources: Path = PROJECT_ROOT / "src", ranks: int = 1, **environment: str
) -> Training:
    """Start a command in its own process group (`ranks` of them, each a rank), with `sources` (src/ or an
    edited copy) importable."""
    environment = {**os.environ, "PYTHONPATH": str(sources), "OMP_NUM_THREADS": "1", **environment}
    # Output goes to a file, not a pipe: runs started together never block on a full pipe.
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")  # a new log, which either kind of start appends to
    processes: list[subprocess.Popen | forked_runs.ForkedRun] = []
    # The project's train, or torchrun's agent (whose ranks are new processes): forked, with PRELOAD imported.
    if command[:2] == [sys.executable, "-m"] and command[2] in ("digits_ddp.train", "torch.distributed.run"):
        for variables in rank_variables(ranks):
            processes.append(forked_runs.start(command, log, {**environment, **variables}, PRELOAD))
    else:
        with log.open("a") as output:
            processes.append(
                subprocess.Popen(
                    command, stdout=output, stderr=subprocess.STDOUT, text=True, env=environment, start_new_session=True
                )
            )
    STARTED.append(Training(processes, log, time.monotonic()))
    return STARTED[-1]


def finish(training: Training, expect_success: bool = True) -> subprocess.CompletedProcess:
    """Wait for a started run; kill it, and all it started, if it outlives RUN_TIMEOUT_S. Its exit code is
    that of its first process that failed."""
    # Killed past the deadline: the whole groups, each rank, or torchrun and every rank.
    code = forked_runs.wait_all(training.processes, training.started + RUN_TIMEOUT_S)
    if code is None:
        pytest.fail(f"training did not finish within {RUN_TIMEOUT_S}s:\n{training.log.read_text()}")
    output = training.log.read_text()
    if expect_success and code != 0:
        pytest.fail(f"training failed with exit code {code}:\n{output}")
    return subprocess.CompletedProcess(training.processes[0].args, code, output)


def start_training(
    run_dir: Path,
    *flags: str,
    ranks: int = 1,
    sources: Path = PROJECT_ROOT / "src",
    launcher: tuple[str, ...] = (),
) -> Training:
    """Start training writing to `run_dir`: in a fresh process, or `ranks` of them given what torchrun gives its
    ranks, or under `launcher` (`torchrun(ranks)`, say).

    `sources` can point at an edited copy of src/ (see `edited_sources`); the output goes to `run_dir`.log.
    """
    command = training_command(run_dir, *flags, launcher=launcher)
    return start(command, run_dir.with_name(f"{run_dir.name}.log"), sources, ranks=1 if launcher else ranks)


def run_training(
    run_dir: Path,
    *flags: str,
    ranks: int = 1,
    expect_success: bool = True,
    sources: Path = PROJECT_ROOT / "src",
    launcher: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """Train to the end, as `start_training` starts it, and return the run's exit code and output."""
    return finish(start_training(run_dir, *flags, ranks=ranks, sources=sources, launcher=launcher), expect_success)


def edited_sources(tmp_path: Path, file: str, old: str, new: str, sources: Path = PROJECT_ROOT / "src") -> Path:
    """A copy of `sources` (src/) with one edit in one of the package's files, as a user might make it."""
    copy = tmp_path / "edited_src"
    shutil.copytree(sources, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / "digits_ddp" / file
    text = path.read_text()
    if old not in text:  # the user replaced the template's default code that this test edits
        pytest.skip(f"{file} no longer holds the default code this test edits: {old!r}")
    path.write_text(text.replace(old, new))
    return copy


def sources_with_a_nan_training_sample(tmp_path: Path) -> Path:
    """data.py whose training split holds one NaN input, which makes one update's gradients NaN per epoch."""
    return edited_sources(
        tmp_path,
        "data.py",
        "    return make_split(1003), make_split(251), make_split(257)",
        "    train = make_split(1003)\n    train.tensors[0][5, 0] = float('nan')\n"
        "    return train, make_split(251), make_split(257)",
    )


def sources_with_dropout(tmp_path: Path, sources: Path = PROJECT_ROOT / "src") -> Path:
    """model.py with dropout before its readout: every training update draws random numbers."""
    readout = "        nn.Linear(config.hidden_size, NUM_CLASSES),\n"
    return edited_sources(tmp_path, "model.py", readout, "        nn.Dropout(0.3),\n" + readout, sources)


def sources_recomputing_the_whole_model(tmp_path: Path, sources: Path) -> Path:
    """model.py whose checkpoint_units returns the whole network: with --activation-checkpointing the
    backward pass runs all of it again, its dropout included, which must draw the same masks."""
    definition = "def checkpoint_units(model: nn.Module) -> list[nn.Module]:\n"
    return edited_sources(tmp_path, "model.py", definition, definition + "    return [model]\n", sources)


def sources_with_random_augmentation(tmp_path: Path) -> Path:
    """data.py whose training samples get fresh random noise every time they are loaded."""
    return edited_sources(
        tmp_path,
        "data.py",
        "    return make_split(1003), make_split(251), make_split(257)",
        """    class Augmented(TensorDataset):
        def __getitem__(self, index):
            inputs, target = super().__getitem__(index)
            return inputs + 0.3 * torch.randn_like(inputs), target

    return Augmented(*make_split(1003).tensors), make_split(251), make_split(257)""",
    )


RECORDING_HOOKS = """import json
from pathlib import Path

STOP_AT_STEP = 0


class Hooks:
    def __init__(self, config):
        self.config = config
        self.updates = 0

    def record(self, run, *event):
        with (Path(self.config.run_dir) / f"hooks-rank{run.rank}.jsonl").open("a") as file:
            file.write(json.dumps(event) + "\\n")

    def on_run_start(self, run):
        self.record(run, "run_start", run.epoch, run.step)

    def on_epoch_start(self, run, epoch):
        self.record(run, "epoch_start", epoch)

    def after_update(self, run):
        self.updates += 1
        self.record(run, "update", run.step)
        if run.step == STOP_AT_STEP and run.rank == run.world_size - 1:
            run.request_stop(f"step {STOP_AT_STEP} reached")

    def on_log(self, run, record):
        self.record(run, "log", record["step"])
        return {"updates_counted": self.updates}

    def after_evaluation(self, run, split, results):
        self.record(run, "evaluation", split)
        name = self.config.monitor.removeprefix("val_")  # val_loss, unless settings.py names another
        return {f"{split}_{name}_doubled": 2 * results[f"{split}_{name}"]}

    def on_epoch_end(self, run, record):
        self.record(run, "epoch_end", record["epoch"])
        if run.is_main:  # what rank 0 has written yet: the epochs logged, and this epoch's checkpoint
            logged = Path(self.config.run_dir) / "metrics.jsonl"
            logged = len(logged.read_text().splitlines()) if logged.exists() else 0
            written = any(Path(self.config.run_dir, "checkpoints").glob(f"epoch-{record['epoch']:04d}.*"))
            with (Path(self.config.run_dir) / "on-epoch-end.jsonl").open("a") as file:
                file.write(json.dumps([record["epoch"], logged, written]) + "\\n")

    def on_run_end(self, run, summary):
        self.record(run, "run_end", summary["steps"])

    def state_dict(self):
        return {"updates": self.updates}

    def load_state_dict(self, state):
        self.updates = state["updates"]
"""


def sources_with_recording_hooks(tmp_path: Path, stop_at: int = 0) -> Path:
    """hooks.py replaced by hooks that record each call to hooks-rank<R>.jsonl in the run directory,
    count the updates (a count kept in the checkpoints), add values to the logs, and stop the run
    from the last rank at update `stop_at`."""
    copy = tmp_path / "hooked_src"
    shutil.copytree(PROJECT_ROOT / "src", copy, ignore=shutil.ignore_patterns("__pycache__"))
    hooks = RECORDING_HOOKS.replace("STOP_AT_STEP = 0", f"STOP_AT_STEP = {stop_at}")
    (copy / "digits_ddp" / "hooks.py").write_text(hooks)
    return copy


def hook_calls(run_dir: Path, rank: int = 0) -> list[list[Any]]:
    """The hook calls recorded by `sources_with_recording_hooks` on `rank`, in order."""
    return [json.loads(line) for line in (run_dir / f"hooks-rank{rank}.jsonl").read_text().splitlines()]


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


def damage(checkpoint: Path) -> None:
    """Flip one bit in the middle of a checkpoint (of the largest file of a folder), as a bad disk might:
    the file keeps its size and still loads, with a wrong number in it."""
    path = max(checkpoint.iterdir(), key=lambda file: file.stat().st_size) if checkpoint.is_dir() else checkpoint
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x10
    path.write_bytes(bytes(content))


def newest_checkpoint(run_dir: Path) -> dict[str, Any]:
    """The run's newest checkpoint, whole, in whichever form the run wrote it."""
    return load_whole(checkpoints_in(run_dir / "checkpoints")[-1])


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return newest_checkpoint(run_dir)["model"]


def final_average(run_dir: Path) -> dict[str, torch.Tensor]:
    """The moving average of the weights (--ema-decay) in the newest checkpoint."""
    return newest_checkpoint(run_dir)["ema"]["weights"]


def assert_same_weights(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor], rtol: float = 0.0) -> None:
    """Equal weights; with `rtol`, up to a relative difference ||left - right|| / ||left|| of the whole model.

    Over the whole model, not per tensor: Adam turns the float noise of a gradient that is zero in
    theory (an attention key bias) into steps the size of the learning rate, so such a tensor can
    differ between 1 and N ranks by percent with no bug in the loop, while a scaling bug (a factor
    of 2, a mean of means) moves the whole model by far more than 1e-5.
    """
    assert left.keys() == right.keys()
    if rtol == 0:
        for name in left:
            torch.testing.assert_close(left[name], right[name], atol=0, rtol=0, msg=name)
        return
    difference = sum(float(((left[name] - right[name]).double() ** 2).sum()) for name in left)
    size = sum(float((left[name].double() ** 2).sum()) for name in left)
    assert difference <= rtol**2 * size, (
        f"the weights differ by {(difference / size) ** 0.5:.2e} (relative), over {rtol}"
    )


def assert_same_metrics(left: list[dict[str, Any]], right: list[dict[str, Any]], rel: float = 0.0) -> None:
    assert len(left) == len(right)
    for left_record, right_record in zip(left, right, strict=True):
        assert left_record.keys() == right_record.keys()
        for name, value in left_record.items():
            assert right_record[name] == pytest.approx(value, rel=rel, abs=rel), (left_record["epoch"], name)
