"""The loop trains, logs, resumes exactly, and stops cleanly on early stopping and NaN."""

import importlib.util
import math
import os
import subprocess
import sys

import pytest
from conftest import (
    PROJECT_ROOT,
    assert_same_metrics,
    assert_same_weights,
    final_weights,
    metrics,
    run_training,
    sources_with_a_nan_training_sample,
    summary,
)

from gan_ddp.config import TrainConfig
from gan_ddp.data import build_datasets

ENVIRONMENT = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}


def test_trains_and_writes_the_run_directory(tmp_path):
    run_training(tmp_path, "--epochs", "3")
    records = metrics(tmp_path)
    assert [record["epoch"] for record in records] == [1, 2, 3]
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    for name in ["config.json", "metrics.csv", "checkpoints/epoch-0003.pt", "checkpoints/best.pt"]:
        assert (tmp_path / name).is_file(), name
    result = summary(tmp_path)
    _, _, test_set = build_datasets(TrainConfig())
    assert result["epochs_run"] == 3
    assert result["test_samples"] == len(test_set)
    assert result["test_loss"] > 0
    assert all(math.isfinite(value) for name, value in result.items() if name.startswith("test_"))


def test_plot_writes_curves_or_explains_what_is_missing(tmp_path):
    run_training(tmp_path, "--epochs", "2")
    result = subprocess.run(
        [sys.executable, "-m", "gan_ddp.plot", str(tmp_path)], capture_output=True, text=True, env=ENVIRONMENT
    )
    if importlib.util.find_spec("matplotlib") is None:
        assert result.returncode == 1 and "needs matplotlib" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        logged = metrics(tmp_path)[0]
        panels = [
            "loss",
            *(name[4:] for name in logged if name.startswith("val_") and name[4:] not in ("loss", "samples")),
        ]
        for name in panels:
            assert (tmp_path / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG"), name


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, precision):
    run_training(tmp_path, "--epochs", "2", "--precision", precision)
    records = metrics(tmp_path)
    assert records[-1]["train_loss"] < records[0]["train_loss"]


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    # The train set does not divide by 64, so the short last batch is split over micro-steps too.
    # --train-in-eval-mode: dropout would draw different masks for differently split batches.
    flags = ("--epochs", "2", "--global-batch-size", "64", "--train-in-eval-mode")
    run_training(tmp_path / "one", *flags)
    run_training(tmp_path / "accum", *flags, "--grad-accum-steps", "4")
    assert_same_weights(final_weights(tmp_path / "one"), final_weights(tmp_path / "accum"), rtol=1e-5)
    assert_same_metrics(metrics(tmp_path / "one"), metrics(tmp_path / "accum"), rel=1e-4)


def test_resume_gives_the_same_result_as_an_uninterrupted_run(tmp_path):
    run_training(tmp_path / "straight", "--epochs", "4")
    run_training(tmp_path / "resumed", "--epochs", "4", "--stop-after-epoch", "2")
    assert not (tmp_path / "resumed" / "summary.json").exists()
    run_training(tmp_path / "resumed", "--epochs", "4", "--resume")
    assert_same_weights(final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed"))
    assert metrics(tmp_path / "straight") == metrics(tmp_path / "resumed")
    assert summary(tmp_path / "straight")["test_loss"] == summary(tmp_path / "resumed")["test_loss"]


def test_early_stopping_ends_the_run(tmp_path):
    # With a zero learning rate the validation loss never improves after the first epoch.
    run_training(tmp_path, "--epochs", "6", "--lr", "0", "--early-stop-patience", "2")
    result = summary(tmp_path)
    assert result["stopped_early"] is True
    assert result["epochs_run"] == 3


def test_a_nan_loss_stops_the_run_with_a_message(tmp_path):
    result = run_training(tmp_path, "--epochs", "2", "--lr", "1e30", "--max-grad-norm", "0", expect_success=False)
    assert result.returncode == 1
    assert "training loss is nan" in result.stdout or "training loss is inf" in result.stdout
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_nan_policy_skip_drops_only_the_bad_updates(tmp_path):
    sources = sources_with_a_nan_training_sample(tmp_path)
    run_training(tmp_path / "run", "--epochs", "2", "--nan-policy", "skip", sources=sources)
    records = metrics(tmp_path / "run")
    assert [record["skipped_updates"] for record in records] == [1, 1]
    assert all(math.isfinite(record["train_loss"]) and math.isfinite(record["val_loss"]) for record in records)
    updates_per_epoch = math.ceil(1003 / 64)
    assert summary(tmp_path / "run")["steps"] == 2 * (updates_per_epoch - 1)

    stopped = run_training(tmp_path / "stopped", "--epochs", "2", sources=sources, expect_success=False)
    assert stopped.returncode == 1
    assert "training loss is nan" in stopped.stdout


def test_nan_policy_skip_still_stops_a_diverged_run(tmp_path):
    result = run_training(
        tmp_path,
        *("--epochs", "2", "--lr", "1e30", "--max-grad-norm", "0"),
        *("--nan-policy", "skip", "--max-consecutive-skips", "3"),
        expect_success=False,
    )
    assert result.returncode == 1
    assert "NaN/inf for 4 updates in a row" in result.stdout
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_bad_batch_split_is_refused(tmp_path):
    result = run_training(tmp_path, "--global-batch-size", "63", "--grad-accum-steps", "2", expect_success=False)
    assert result.returncode != 0
    assert "--global-batch-size 63 must be divisible" in result.stdout


def test_a_finished_run_is_not_overwritten(tmp_path):
    run_training(tmp_path, "--epochs", "1")
    before = final_weights(tmp_path)
    result = run_training(tmp_path, "--epochs", "1", expect_success=False)
    assert result.returncode == 2 and "--resume" in result.stdout
    assert_same_weights(before, final_weights(tmp_path))


def test_a_corrupt_newest_checkpoint_is_skipped_on_resume(tmp_path):
    run_training(tmp_path / "straight", "--epochs", "3")
    run_training(tmp_path / "crashed", "--epochs", "3", "--stop-after-epoch", "2")
    newest = tmp_path / "crashed" / "checkpoints" / "epoch-0002.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # as if the disk lost the end of the file
    result = run_training(tmp_path / "crashed", "--epochs", "3", "--resume")
    assert "skipping unreadable checkpoint" in result.stdout
    assert "resumed from epoch 1" in result.stdout
    assert_same_weights(final_weights(tmp_path / "straight"), final_weights(tmp_path / "crashed"))


def test_resuming_with_a_changed_learning_rate_is_refused(tmp_path):
    run_training(tmp_path, "--epochs", "2", "--stop-after-epoch", "1")
    result = run_training(tmp_path, "--epochs", "2", "--resume", "--lr", "1e-5", expect_success=False)
    assert result.returncode == 2
    assert "cannot resume with a changed --lr 1e-05 (the run used 0.003)" in result.stdout


def test_resuming_with_a_different_model_is_refused(tmp_path):
    run_training(tmp_path / "run", "--epochs", "2", "--stop-after-epoch", "1")
    # A setting of settings.py that changes the network's shape.
    result = run_training(tmp_path / "run", "--epochs", "2", "--resume", "--hidden-size", "32", expect_success=False)
    assert result.returncode == 1
    assert "does not fit the model and optimizer built by model.py" in result.stdout
