"""The loop trains, logs, plots, stops on SIGTERM or Ctrl-C and resumes, and refuses bad input, on one replica.

Accumulation, resume part-way, early stopping, short batches and NaN handling are tested in the
strategy's own test file: test_one_device.py, or test_distributed.py on two replicas.
"""

import importlib.util
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import (
    PROJECT_ROOT,
    TRAIN_FLAGS,
    assert_same_weights,
    final_weights,
    finish,
    metrics,
    run_training,
    start_training,
    summary,
)
from project import evaluated_samples, final_split, final_test, losses, monitored_improved, samples_per_epoch

from gpt_mirrored.kit.config import TrainConfig
from gpt_mirrored.kit.errors import ConfigError


def test_trains_and_writes_the_run_directory(reference):
    records = metrics(reference)
    assert [record["epoch"] for record in records] == [1, 2, 3]
    assert monitored_improved(records)
    assert all(math.isfinite(record[name]) for record in records for name in losses(record))
    assert all(record["val_samples"] == evaluated_samples("val") for record in records)
    header = (reference / "metrics.csv").read_text().splitlines()[0]
    assert header.split(",") == list(json.loads((reference / "metrics.jsonl").read_text().splitlines()[0]))
    for name in ["config.json", "checkpoints/checkpoint", "checkpoints/epoch-3.index", "checkpoints/best/checkpoint"]:
        assert (reference / name).is_file(), name
    result = summary(reference)
    assert result["epochs_run"] == 3 and result["stopped_early"] is False
    split = final_split()  # "test", or "val" where data.py builds no test set
    assert final_test(reference)[f"{split}_samples"] == evaluated_samples(split)
    assert all(math.isfinite(value) for value in final_test(reference).values())
    # The training speed leaves validation and the test out: their time is eval_time_s (rounded to 10 ms, so a
    # fast evaluation of a small split reads 0.0).
    assert result["eval_time_s"] >= 0
    trained = 3 * samples_per_epoch()
    # Both figures are rounded (train_time_s to 10 ms, which is much of a run on a fast GPU): the speed
    # lies between what the ends of that rounding give.
    seconds, speed = result["train_time_s"], result["train_samples_per_s"]
    assert trained / (seconds + 0.005) - 0.05 <= speed <= trained / max(seconds - 0.005, 1e-9) + 0.05


def test_plot_writes_curves_or_explains_what_is_missing(reference):
    environment = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    command = [sys.executable, "-m", "gpt_mirrored.kit.plot", str(reference)]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    if importlib.util.find_spec("matplotlib") is None:
        assert result.returncode == 1 and "needs matplotlib" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        logged = metrics(reference)[0]
        others = [name for name in logged if name.startswith("val_") and name not in [*losses(logged), "val_samples"]]
        panels = ["loss", *(name.removeprefix("val_") for name in others)]  # "loss": every loss, on one panel
        for name in panels:
            assert (reference / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG"), name


def test_bad_batch_split_is_refused():
    with pytest.raises(ConfigError, match="--global-batch-size 63 must be divisible by replicas x --grad-accum-steps"):
        TrainConfig(global_batch_size=63, grad_accum_steps=2).check_batch_split(replicas=1)


def test_a_finished_run_is_not_overwritten(reference):
    before = final_weights(reference)
    result = run_training(reference, *TRAIN_FLAGS, expect_success=False)
    assert result.returncode == 2 and "--resume" in result.stdout
    assert_same_weights(before, final_weights(reference))


def test_config_rejects_out_of_range_values():
    with pytest.raises(ConfigError, match="--epochs must be at least 1"):
        TrainConfig(epochs=0).validate()
    with pytest.raises(ConfigError, match="--lr must not be negative"):
        TrainConfig(lr=-1.0).validate()
    with pytest.raises(ConfigError, match="--nan-policy skip does not combine with --precision fp16"):
        TrainConfig(nan_policy="skip", precision="fp16").validate()


@pytest.mark.parametrize(("name", "code"), [("SIGTERM", 143), ("Ctrl-C", 130)])
def test_a_signal_checkpoints_and_the_resumed_run_ends_like_an_uninterrupted_one(reference, tmp_path, name, code):
    # What Slurm and Kubernetes send before a kill, or a Ctrl-C: the run stops at its next --log-every
    # check (here after every update) with a checkpoint, exit status 128 + the signal, and --resume
    # carries on exactly.
    flags = (*TRAIN_FLAGS, "--steps-per-call", "1", "--log-every", "1")
    training = start_training(tmp_path, *flags)
    deadline = time.monotonic() + 120
    while not (tmp_path / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    training.send_signal(signal.SIGINT if name == "Ctrl-C" else signal.SIGTERM)
    result = finish(training, expect_success=False)
    assert result.returncode == code, result.stdout
    assert result.stdout.count(f"{name}: stopping at the next --log-every boundary, with a checkpoint") == 1
    assert f"stopped by {name} after" in result.stdout and "Traceback" not in result.stdout
    run_training(tmp_path, *flags, "--resume")
    assert_same_weights(final_weights(reference), final_weights(tmp_path))
    assert metrics(reference) == metrics(tmp_path)


def test_the_schedule_warms_up_then_decays_to_min_lr_and_an_optim_py_that_drops_it_is_refused():
    from gpt_mirrored.kit.errors import DataError
    from gpt_mirrored.kit.schedules import WarmupSchedule, check_floor
    from gpt_mirrored.optim import build_schedule

    config = TrainConfig(lr=1e-3, warmup_steps=2, min_lr=1e-4)
    schedule = build_schedule(config, 10)
    rates = [float(schedule(step)) for step in range(11)]
    assert rates[:3] == pytest.approx([5e-4, 1e-3, 1e-3])  # warmup, then the peak
    assert all(later < earlier for earlier, later in itertools.pairwise(rates[2:]))
    assert rates[10] == pytest.approx(1e-4)  # after the last update: the floor
    check_floor(schedule, config.min_lr)
    # An optim.py written before --min-lr existed builds the schedule without it: refused, not ignored.
    with pytest.raises(DataError, match=r"ends at min_lr=0.0, but --min-lr is 0.0001: pass min_lr=config.min_lr"):
        check_floor(WarmupSchedule(1e-3, "cosine", 2, 10), config.min_lr)
