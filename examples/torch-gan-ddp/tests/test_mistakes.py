"""Mistakes in flags, data and user files: one line naming what to fix, no traceback, nothing lost."""

import math
from pathlib import Path

import pytest
from conftest import edited_sources, run_training, summary

from gan_ddp.config import TrainConfig
from gan_ddp.errors import ConfigError


def test_config_rejects_out_of_range_values():
    with pytest.raises(ConfigError, match="--epochs must be at least 1"):
        TrainConfig(epochs=0).validate()
    with pytest.raises(ConfigError, match="--lr must not be negative"):
        TrainConfig(lr=-1.0).validate()
    with pytest.raises(ConfigError, match="--max-grad-norm must be a finite number"):
        TrainConfig(max_grad_norm=math.nan).validate()
    with pytest.raises(ConfigError, match="--seed must be between 0 and 2"):
        TrainConfig(seed=10**23).validate()
    with pytest.raises(ConfigError, match="--num-workers 100000 is far more"):
        TrainConfig(num_workers=100000).validate()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--lr", "nan"), "argument --lr: invalid finite float value: 'nan'"),
        (("--weight-decay", "inf"), "argument --weight-decay: invalid finite float value: 'inf'"),
        (("--seed", "1e23"), "argument --seed: invalid int value: '1e23'"),
        (("--seed", "-1"), "--seed must be between 0 and 2**63 - 1, got -1"),
    ],
)
def test_bad_flag_values_are_one_line(flags, message):
    result = run_training(Path("unused"), *flags, expect_success=False)
    assert result.returncode == 2
    assert message in result.stdout and "Traceback" not in result.stdout


def test_a_global_batch_larger_than_the_train_set_is_refused(tmp_path):
    result = run_training(tmp_path, "--global-batch-size", "2048", expect_success=False)
    assert result.returncode == 1
    assert "--global-batch-size 2048 is larger than the train set (1003 samples)" in result.stdout


def test_a_wrong_input_shape_names_the_file_to_fix(tmp_path):
    sources = edited_sources(
        tmp_path, "data.py", "TensorDataset(inputs, targets)", "TensorDataset(inputs[:, 1:], targets)"
    )
    result = run_training(tmp_path / "run", "--epochs", "1", sources=sources, expect_success=False)
    assert result.returncode == 1
    assert "step.py:" in result.stdout and "failed in train_step: RuntimeError: mat1 and mat2" in result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize(
    ("file", "old", "new", "message"),
    [
        ("loss.py", 'reduction="none")', 'reduction="mean")', "Mean() takes one value per sample"),
        ("loss.py", 'reduction="none")', 'reduction="none").detach()', "loss from train_step has no gradient"),
        ("loss.py", 'reduction="none")', 'reduction="none").sum().item()', "Mean() takes one value per sample"),
        ("metrics.py", ".float())}", '.float()), "f1": None}', "returned 'f1' as None; return a Mean or a Gather"),
        ("metrics.py", '{"accuracy":', '{"loss":', "metrics.py returns a metric named 'loss'"),
    ],
    ids=["averaged-loss", "detached-loss", "float-loss", "none-metric", "metric-named-loss"],
)
def test_a_wrong_value_from_a_user_file_names_it(tmp_path, file, old, new, message):
    sources = edited_sources(tmp_path, file, old, new)
    result = run_training(tmp_path / "run", "--epochs", "1", sources=sources, expect_success=False)
    assert result.returncode == 1, result.stdout
    assert message in result.stdout
    assert "Traceback" not in result.stdout


def test_an_out_of_range_label_deep_in_the_data_names_the_file(tmp_path):
    sources = edited_sources(
        tmp_path,
        "data.py",
        "    return make_split(1003), make_split(251), make_split(257)",
        "    train = make_split(1003)\n    train.tensors[1][500] = 7\n"
        "    return train, make_split(251), make_split(257)",
    )
    result = run_training(tmp_path / "run", "--epochs", "1", sources=sources, expect_success=False)
    assert result.returncode == 1
    assert "loss.py:" in result.stdout and "Target 7 is out of bounds" in result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_sample_of_another_shape_deep_in_the_data_names_the_file(tmp_path, workers):
    sources = edited_sources(
        tmp_path,
        "data.py",
        "        return TensorDataset(inputs, targets)",
        "        items = list(zip(inputs, targets, strict=True))\n"
        "        items[min(500, size - 1)] = (inputs[0, :3], targets[0])\n"
        "        return items  # type: ignore[return-value]",
    )
    result = run_training(
        tmp_path / "run", "--epochs", "1", "--num-workers", workers, sources=sources, expect_success=False
    )
    assert result.returncode == 1
    assert "data.py: could not collate" in result.stdout and "need a collate() in data.py" in result.stdout
    assert "Traceback" not in result.stdout


def test_nan_test_data_fails_the_run_but_keeps_its_results(tmp_path):
    sources = edited_sources(
        tmp_path,
        "data.py",
        "    return make_split(1003), make_split(251), make_split(257)",
        "    test = make_split(257)\n    test.tensors[0][3, 0] = float('nan')\n"
        "    return make_split(1003), make_split(251), test",
    )
    result = run_training(tmp_path / "run", "--epochs", "1", sources=sources, expect_success=False)
    assert result.returncode == 1
    assert "test_loss is nan at the final test" in result.stdout and "check the test data" in result.stdout
    assert summary(tmp_path / "run")["epochs_run"] == 1  # the run's results are kept


def test_nan_validation_data_is_not_blamed_on_the_learning_rate(tmp_path):
    sources = edited_sources(
        tmp_path,
        "data.py",
        "    return make_split(1003), make_split(251), make_split(257)",
        "    val = make_split(251)\n    val.tensors[0][3, 0] = float('nan')\n"
        "    return make_split(1003), val, make_split(257)",
    )
    result = run_training(tmp_path / "run", "--epochs", "1", sources=sources, expect_success=False)
    assert result.returncode == 1
    assert "val_loss is nan at epoch 1" in result.stdout and "check the val data" in result.stdout
    assert "lower --lr" not in result.stdout
    assert not list((tmp_path / "run" / "checkpoints").glob("*.pt"))


def test_a_damaged_best_checkpoint_tests_the_last_weights(tmp_path):
    # With a zero learning rate epoch 1 stays the best, so best.pt is not the newest checkpoint.
    run_training(tmp_path, "--epochs", "2", "--lr", "0", "--stop-after-epoch", "1")
    best = tmp_path / "checkpoints" / "best.pt"
    best.unlink()  # it is a hard link of epoch-0001.pt: replace it, do not damage the epoch checkpoint
    best.write_bytes(b"not a checkpoint")
    result = run_training(tmp_path, "--epochs", "2", "--lr", "0", "--resume")
    assert "warning: cannot load" in result.stdout
    assert summary(tmp_path)["tested_checkpoint"] == "last (best.pt unreadable)"


def test_an_unwritable_run_dir_fails_before_training(tmp_path):
    (tmp_path / "a-file").write_text("")
    result = run_training(tmp_path / "a-file" / "run", "--epochs", "1", expect_success=False)
    assert result.returncode == 2
    assert "cannot write to --run-dir" in result.stdout
    assert "epoch 1" not in result.stdout


def test_an_unknown_flag_is_refused():
    result = run_training(Path("unused"), "--epoch", "3", expect_success=False)
    assert result.returncode == 2
    assert "unrecognized arguments: --epoch" in result.stdout
