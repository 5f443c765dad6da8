"""The loop's contract on the CPU: resume equals no interruption, a run gets its own folder, SIGTERM stops
with a checkpoint, BatchNorm's running statistics train and resume with the weights.

Every run gets settings.py's TEST_DEFAULTS first (`flags_for_tests`): there a project with a large corpus
keeps its test runs to seconds, with {"steps_per_epoch": 8, "eval_batches": 2} say."""

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

# The devices of every run here: this machine's default (test_distributed.py, in a project with a mesh, runs
# on several devices and processes).
DEVICES: tuple[str, ...] = ()


def run_flags(run_dir: Path, *flags: str) -> list[str]:
    """The flags of a run of 2 epochs into `run_dir`: settings.py's TEST_DEFAULTS first, `flags` last."""
    return [*flags_for_tests(), "--run-dir", str(run_dir), "--epochs", "2", *flags]


def train(
    run_dir: Path, *flags: str, processes: int = 0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A run of 2 epochs; with `processes`, that many processes started by kit/launch.py (in a project with a
    mesh); `env` adds to its environment."""
    flags = tuple(run_flags(run_dir, *flags))
    command = [sys.executable, "-m", "digits_dp.train", *flags]
    if processes:
        command = [sys.executable, "-m", "digits_dp.kit.launch", "--processes", str(processes), "--", *flags]
    environment = {**os.environ, **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def epoch_ends(run_dir: Path) -> list[int]:
    """The update at the end of each epoch of a finished run."""
    return [record["step"] for record in records(run_dir)]


def evaluated_samples(name: str) -> int:
    """The samples an evaluation of data.py's split `name` ("val", "test") uses: the whole split, or
    --eval-batches x --eval-batch-size of it."""
    from digits_dp.data import build_datasets
    from digits_dp.kit.config import parse_config
    from digits_dp.kit.sampling import split_size

    config = parse_config(list(flags_for_tests()))
    size = split_size(dict(zip(("train", "val", "test"), build_datasets(config), strict=True))[name])
    return min(size, config.eval_batches * config.eval_batch_size or size)


@functools.cache
def flags_for_tests() -> tuple[str, ...]:
    """settings.py's TEST_DEFAULTS as flags: every test run gets them, before the test's own flags."""
    from digits_dp import settings  # imported here, once src/ is on the path
    from digits_dp.kit.config import TrainConfig

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


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "uninterrupted"
    done = train(run_dir, *DEVICES)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def assert_same_run(run_dir: Path, uninterrupted: Path) -> None:
    whole, again = records(uninterrupted), records(run_dir)
    assert [record["epoch"] for record in again] == [1, 2]
    for first, second in zip(whole, again, strict=True):
        for name in ("train_loss", "val_loss"):
            assert second[name] == pytest.approx(first[name], rel=1e-6), name


def test_a_resumed_run_equals_the_uninterrupted_one(uninterrupted: Path, tmp_path: Path) -> None:
    stopped = train(tmp_path / "run", *DEVICES, "--stop-after-step", "5")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    resumed = train(tmp_path / "run", *DEVICES, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(tmp_path / "run", uninterrupted)


def test_sigterm_stops_at_a_log_boundary_with_a_checkpoint_and_resume_goes_on_exactly(
    uninterrupted: Path, tmp_path: Path
) -> None:
    # With --async-checkpoints: the checkpoint the signal asks for is written in the background, and finished
    # before the run exits.
    flags = run_flags(tmp_path / "run", *DEVICES, "--log-every", "1", "--async-checkpoints")
    command = [sys.executable, "-m", "digits_dp.train", *flags]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines = []
    # The signal once the run has said where it trains (its handlers are set): while the first update compiles.
    while not (lines and lines[-1].startswith("run ")) and process.poll() is None:
        lines.append(process.stdout.readline())
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=300)
    output = "".join(lines) + output
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "stopped by SIGTERM after update" in output
    resumed = train(tmp_path / "run", *DEVICES, "--log-every", "1", "--async-checkpoints", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(tmp_path / "run", uninterrupted)


def test_kill_9_loses_at_most_the_updates_since_the_last_checkpoint(uninterrupted: Path, tmp_path: Path) -> None:
    # No handler runs on SIGKILL: what survives is the newest finished checkpoint (one kept), never a half-written one.
    run_dir, every = tmp_path / "run", 4
    flags = (*DEVICES, "--log-every", "1", "--checkpoint-every", str(every), "--keep-checkpoints", "1")
    command = [sys.executable, "-m", "digits_dp.train", *run_flags(run_dir, *flags)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    steps, deadline = run_dir / "steps.jsonl", time.monotonic() + 300
    while (not steps.exists() or len(steps.read_text().splitlines()) < 2 * every + 2) and time.monotonic() < deadline:
        time.sleep(0.02)  # update 10 logged: checkpoints 4 and 8 are finished (the placeholder's epoch: 16 updates)
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL  # killed while training, not finished
    logged = len(steps.read_text().splitlines())
    folders = (run_dir / "checkpoints").iterdir()
    finished = [int(folder.name) for folder in folders if (folder / "commit_success.txt").exists()]
    assert len(finished) == 1 and finished[0] >= logged - every, (finished, logged)
    resumed = train(run_dir, *DEVICES, "--log-every", "1", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run_dir, uninterrupted)


def test_the_best_epoch_is_kept_and_tested_and_early_stopping_ends_the_run(uninterrupted: Path, tmp_path: Path) -> None:
    # Monitored as if a higher training loss were better: epoch 1 is the best, epoch 2 not, and patience 1 stops.
    flags = ("--monitor", "train_loss", "--monitor-mode", "max", "--early-stop-patience", "1")
    done = train(tmp_path / "run", *DEVICES, *flags, "--keep-checkpoints", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_run(tmp_path / "run", uninterrupted)  # it trains alike
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["best_epoch"] == 1 and summary["stopped_early"] and summary["tested_checkpoint"] == "best (epoch 1)"
    kept = sorted(int(folder.name) for folder in (tmp_path / "run" / "checkpoints").iterdir())
    assert kept == epoch_ends(uninterrupted)  # the best epoch's and the newest
    last = json.loads((uninterrupted / "summary.json").read_text())  # by val_loss, epoch 2 is its best
    assert last["tested_checkpoint"] == "best (epoch 2, the final weights)"
    assert summary["test_loss"] != pytest.approx(last["test_loss"], rel=1e-3)  # epoch 1's weights were tested


def test_the_weights_moving_average_is_evaluated_beside_them_and_resumes_exactly(tmp_path: Path) -> None:
    average = ("--ema-decay", "0.9")
    whole = train(tmp_path / "whole", *DEVICES, *average)
    assert whole.returncode == 0, whole.stderr[-3000:]
    stopped = train(tmp_path / "run", *DEVICES, *average, "--stop-after-step", "5")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    resumed = train(tmp_path / "run", *DEVICES, *average, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(tmp_path / "run", tmp_path / "whole")
    for first, second in zip(records(tmp_path / "whole"), records(tmp_path / "run"), strict=True):
        assert second["val_ema_loss"] == pytest.approx(first["val_ema_loss"], rel=1e-6)  # the average resumed too
        assert second["val_ema_loss"] != pytest.approx(second["val_loss"], rel=1e-3)  # an average, not the weights
    first, second = records(tmp_path / "run")
    assert second["val_ema_loss"] < first["val_ema_loss"]  # the average follows the weights as they train
    assert "test_ema_accuracy" in json.loads((tmp_path / "run" / "summary.json").read_text())


def test_validation_inside_epochs_on_a_fixed_subset_is_logged_and_changes_no_update(
    uninterrupted: Path, tmp_path: Path
) -> None:
    done = train(tmp_path / "run", *DEVICES, "--eval-every", "5", "--eval-batches", "1", "--eval-batch-size", "64")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    ends = epoch_ends(uninterrupted)  # validated anyway, with the epoch's record
    assert [step["step"] for step in steps if "val_loss" in step] == [n for n in range(5, ends[-1], 5) if n not in ends]
    assert [record["val_samples"] for record in records(tmp_path / "run")] == [64, 64]  # one batch of the split
    for first, second in zip(records(uninterrupted), records(tmp_path / "run"), strict=True):
        assert second["train_loss"] == pytest.approx(first["train_loss"], rel=1e-6)


def test_steps_per_epoch_ends_each_epoch_after_that_many_updates_and_resumes_within_one(tmp_path: Path) -> None:
    short = ("--steps-per-epoch", "5")
    whole = train(tmp_path / "whole", *DEVICES, *short)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert [record["step"] for record in records(tmp_path / "whole")] == [5, 10]
    stopped = train(tmp_path / "run", *DEVICES, *short, "--stop-after-step", "7")  # in the second epoch
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    resumed = train(tmp_path / "run", *DEVICES, *short, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(tmp_path / "run", tmp_path / "whole")


def test_a_nan_sample_stops_the_run_or_with_nan_policy_skip_only_its_update(tmp_path: Path) -> None:
    sources = tmp_path / "src"
    shutil.copytree(Path(__file__).resolve().parents[1] / "src", sources)
    data = sources / "digits_dp" / "data.py"
    line = "    return make_split(1003), make_split(251), make_split(257)\n"
    if line not in data.read_text():
        pytest.skip("data.py is yours now: this test plants a NaN in the template's placeholder data")
    planted = "    train = make_split(1003)\n    train[0][7] = np.nan  # sample 7's inputs\n"
    data.write_text(data.read_text().replace(line, planted + "    return train, make_split(251), make_split(257)\n"))
    environment = {"PYTHONPATH": str(sources)}
    stopped = train(tmp_path / "stop", *DEVICES, env=environment)
    assert stopped.returncode == 1 and "error: the loss became NaN or inf by update" in stopped.stderr, stopped.stderr
    skipped = train(tmp_path / "skip", *DEVICES, "--nan-policy", "skip", env=environment)
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    assert [record["skipped_updates"] for record in records(tmp_path / "skip")] == [1, 1]  # sample 7's, each epoch
    assert "warning: NaN/inf gradients: 1 update(s) skipped" in skipped.stdout


def test_bf16_computes_in_bfloat16_and_keeps_the_weights_in_float32(uninterrupted: Path, tmp_path: Path) -> None:
    done = train(tmp_path / "run", *DEVICES, "--precision", "bf16")
    assert done.returncode == 0, done.stderr[-3000:]
    for first, second in zip(records(uninterrupted), records(tmp_path / "run"), strict=True):
        assert second["val_loss"] == pytest.approx(first["val_loss"], rel=0.1)  # the same training, rounded coarser
        assert second["train_loss"] != pytest.approx(first["train_loss"], rel=1e-6)  # computed in bfloat16
    weights = saved_state(tmp_path / "run" / "checkpoints" / str(epoch_ends(uninterrupted)[-1]))["params"]
    assert {str(array.dtype) for array in jax.tree.leaves(weights)} == {"float32"}


def test_a_run_gets_a_folder_of_its_own_and_resume_finds_the_newest(uninterrupted: Path, tmp_path: Path) -> None:
    pattern = str(tmp_path / "runs" / "{start}")
    first = train(Path(pattern), *DEVICES, "--stop-after-step", "3", "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    (folder,) = [path for path in (tmp_path / "runs").iterdir() if path.name != "latest"]
    assert (folder / "config.json").exists()
    again = train(Path(pattern), *DEVICES, "--resume", "--epochs", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert epoch_ends(folder) == epoch_ends(uninterrupted)[:1]  # the stopped run's folder, finished
    refused = train(folder, *DEVICES)
    assert refused.returncode == 2 and "already holds a run; pass --resume" in refused.stderr


def test_batchnorm_statistics_move_with_training_and_a_resumed_run_goes_on_with_them(tmp_path: Path) -> None:
    # State besides the weights: the update carries BatchNorm's running statistics out, the checkpoint
    # holds them, evaluation uses them. Planted in a copy of the template's placeholder model.
    sources = tmp_path / "src"
    shutil.copytree(Path(__file__).resolve().parents[1] / "src", sources)
    model = sources / "digits_dp" / "model.py"
    layer, call = "        self.output = nnx.Linear(hidden_size, NUM_CLASSES, rngs=rngs)\n", "self.hidden(inputs)"
    if layer not in model.read_text() or call not in model.read_text():
        pytest.skip("model.py is yours now: this test plants a BatchNorm in the template's placeholder model")
    norm = "        self.norm = nnx.BatchNorm(hidden_size, rngs=rngs)\n"
    model.write_text(model.read_text().replace(layer, layer + norm).replace(call, f"self.norm({call})"))
    environment = {"PYTHONPATH": str(sources)}  # the copy, not the project's own src/
    whole = train(tmp_path / "whole", *DEVICES, env=environment)
    assert whole.returncode == 0, whole.stderr[-3000:]
    stopped = train(tmp_path / "run", *DEVICES, "--stop-after-step", "5", env=environment)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    resumed = train(tmp_path / "run", *DEVICES, "--resume", env=environment)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(tmp_path / "run", tmp_path / "whole")
    last = tmp_path / "whole" / "checkpoints" / str(epoch_ends(tmp_path / "whole")[-1])
    statistics = saved_state(last)["rest"]["norm"]
    assert np.abs(statistics["mean"]["value"]).max() > 1e-3  # BatchNorm starts from mean 0 and variance 1
    assert np.abs(statistics["var"]["value"] - 1).max() > 1e-2


def saved_state(checkpoint: Path) -> dict:
    """A checkpoint's training state as NumPy arrays, whatever devices wrote it."""
    reader, folder = ocp.PyTreeCheckpointer(), (checkpoint / "state").absolute()
    tree = reader.metadata(folder).item_metadata.tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return reader.restore(folder, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
