"""Mistakes in flags, data and user files: one line naming what to fix, no traceback, nothing lost.

The failing runs start together in the `mistakes` fixture (each is mostly Python's and torch's
start-up) and are checked one by one.
"""

import math
import subprocess

import pytest
from conftest import (
    edited_sources,
    finish,
    run_training,
    start,
    start_training,
    summary,
    training_command,
)
from project import (
    split_sizes,
)

from gan_ddp.config import TrainConfig, parse_config
from gan_ddp.errors import ConfigError

SPLITS = "    return make_split(1003), make_split(251), make_split(257)"
# The loss.py mistakes reach the engine through the default train_step, which hands the loss on as it is.
DEFAULT_STEP = "    return Mean(per_sample_loss(model(inputs), targets))"

# flags: the message that refuses them.
BAD_FLAGS = {
    ("--lr", "nan"): "argument --lr: invalid finite float value: 'nan'",
    ("--weight-decay", "inf"): "argument --weight-decay: invalid finite float value: 'inf'",
    ("--seed", "1e23"): "argument --seed: invalid int value: '1e23'",
    ("--seed", "-1"): "--seed must be between 0 and 2**63 - 1, got -1",
}

# name: (file, old, new, message): an edit of a user file that the run refuses with the message.
USER_FILE_MISTAKES = {
    "averaged-loss": ("loss.py", 'reduction="none")', 'reduction="mean")', "Mean() takes one value per sample"),
    "detached-loss": (
        "loss.py",
        'reduction="none")',
        'reduction="none").detach()',
        "loss from train_step has no gradient",
    ),
    "float-loss": (
        "loss.py",
        'reduction="none")',
        'reduction="none").sum().item()',
        "Mean() takes one value per sample",
    ),
    "none-metric": (
        "metrics.py",
        ".float())}",
        '.float()), "f1": None}',
        "returned 'f1' as None; return a Mean or a Gather",
    ),
    "metric-named-loss": ("metrics.py", '{"accuracy":', '{"loss":', "metrics.py returns a metric named 'loss'"),
}

# name: (file, old, new), an edit of the default sources, each a mistake a user might make.
EDITS = {
    "wrong_shape": ("data.py", "TensorDataset(inputs, targets)", "TensorDataset(inputs[:, 1:], targets)"),
    **{name: (file, old, new) for name, (file, old, new, _) in USER_FILE_MISTAKES.items()},
    "label_out_of_range": (
        "data.py",
        SPLITS,
        "    train = make_split(1003)\n    train.tensors[1][500] = 7\n"
        "    return train, make_split(251), make_split(257)",
    ),
    "sample_of_another_shape": (
        "data.py",
        "        return TensorDataset(inputs, targets)",
        "        items = list(zip(inputs, targets, strict=True))\n"
        "        items[min(500, size - 1)] = (inputs[0, :3], targets[0])\n"
        "        return items  # type: ignore[return-value]",
    ),
    "nan_test_data": (
        "data.py",
        SPLITS,
        "    test = make_split(257)\n    test.tensors[0][3, 0] = float('nan')\n"
        "    return make_split(1003), make_split(251), test",
    ),
    "nan_val_data": (
        "data.py",
        SPLITS,
        "    val = make_split(251)\n    val.tensors[0][3, 0] = float('nan')\n"
        "    return make_split(1003), val, make_split(257)",
    ),
}


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    """The failing runs of the tests below, started together: by name, the run's output, or the
    skip of an edit whose code you have replaced (the test of that edit skips)."""
    root = tmp_path_factory.mktemp("mistakes")
    started = {}
    for index, flags in enumerate(BAD_FLAGS):
        started[" ".join(flags)] = start_training(root / f"bad_flags_{index}", *flags)
    started["unknown_flag"] = start_training(root / "unknown_flag", "--epoch", "3")
    too_large = str(2 * split_sizes()[0])
    started["too_large_batch"] = start_training(root / "too_large_batch", "--global-batch-size", too_large)
    (root / "a-file").write_text("")
    started["unwritable"] = start(training_command(root / "a-file" / "run", "--epochs", "1"), root / "unwritable.log")
    skipped = {}
    for name, edit in EDITS.items():
        runs = [f"{name}_0", f"{name}_2"] if name == "sample_of_another_shape" else [name]
        try:
            sources = edited_sources(root / f"{name}_src", *edit)
            if edit[0] == "loss.py":
                edited_sources(root / f"{name}_step", "step.py", DEFAULT_STEP, DEFAULT_STEP)
        except pytest.skip.Exception as skip:
            skipped |= dict.fromkeys(runs, skip)
            continue
        if name == "sample_of_another_shape":  # read by the main process, and by 2 DataLoader workers
            for workers in ("0", "2"):
                run_dir = root / f"{name}_{workers}"
                flags = ("--epochs", "1", "--num-workers", workers)
                started[run_dir.name] = start_training(run_dir, *flags, sources=sources)
        else:
            started[name] = start_training(root / name, "--epochs", "1", sources=sources)
    results = {name: finish(training, expect_success=False) for name, training in started.items()}
    return root, {**results, **skipped}


def outcome(mistakes, name: str) -> subprocess.CompletedProcess:
    """The output of the run `name` of the `mistakes` fixture; skips the test if its edit no longer applies."""
    _, results = mistakes
    if isinstance(results[name], pytest.skip.Exception):
        raise results[name]
    return results[name]


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


@pytest.mark.parametrize(("flags", "message"), BAD_FLAGS.items())
def test_bad_flag_values_are_one_line(mistakes, flags, message):
    result = outcome(mistakes, " ".join(flags))
    assert result.returncode == 2
    assert message in result.stdout and "Traceback" not in result.stdout


def test_a_global_batch_larger_than_the_train_set_is_refused(mistakes):
    result = outcome(mistakes, "too_large_batch")
    assert result.returncode == 1
    expected = f"--global-batch-size {2 * split_sizes()[0]} is larger than the train set ({split_sizes()[0]} samples)"
    assert expected in result.stdout


def test_a_wrong_input_shape_names_the_file_to_fix(mistakes):
    result = outcome(mistakes, "wrong_shape")
    assert result.returncode == 1
    assert "step.py:" in result.stdout and "failed in train_step: RuntimeError: mat1 and mat2" in result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize("name", USER_FILE_MISTAKES)
def test_a_wrong_value_from_a_user_file_names_it(mistakes, name):
    *_, message = USER_FILE_MISTAKES[name]
    result = outcome(mistakes, name)
    assert result.returncode == 1, result.stdout
    assert message in result.stdout
    assert "Traceback" not in result.stdout


def test_an_out_of_range_label_deep_in_the_data_names_the_file(mistakes):
    result = outcome(mistakes, "label_out_of_range")
    assert result.returncode == 1
    assert "loss.py:" in result.stdout and "Target 7 is out of bounds" in result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_sample_of_another_shape_deep_in_the_data_names_the_file(mistakes, workers):
    result = outcome(mistakes, f"sample_of_another_shape_{workers}")
    assert result.returncode == 1
    assert "data.py: could not collate" in result.stdout and "need a collate() in data.py" in result.stdout
    assert "Traceback" not in result.stdout


def test_nan_test_data_fails_the_run_but_keeps_its_results(mistakes):
    root, _ = mistakes
    result = outcome(mistakes, "nan_test_data")
    assert result.returncode == 1
    assert "test_loss is nan at the final test" in result.stdout and "check the test data" in result.stdout
    assert summary(root / "nan_test_data")["epochs_run"] == 1  # the run's results are kept


def test_nan_validation_data_is_not_blamed_on_the_learning_rate(mistakes):
    root, _ = mistakes
    result = outcome(mistakes, "nan_val_data")
    assert result.returncode == 1
    assert "val_loss is nan at epoch 1" in result.stdout and "check the val data" in result.stdout
    assert "lower --lr" not in result.stdout
    assert not list((root / "nan_val_data" / "checkpoints").glob("*.pt"))


def test_a_damaged_best_checkpoint_tests_the_last_weights(tmp_path):
    # With a zero learning rate epoch 1 stays the best, so best.pt is not the newest checkpoint.
    run_training(tmp_path, "--epochs", "2", "--lr", "0", "--stop-after-epoch", "1")
    best = tmp_path / "checkpoints" / "best.pt"
    best.unlink()  # it is a hard link of epoch-0001.pt: replace it, do not damage the epoch checkpoint
    best.write_bytes(b"not a checkpoint")
    result = run_training(tmp_path, "--epochs", "2", "--lr", "0", "--resume")
    assert "warning: cannot load" in result.stdout
    assert summary(tmp_path)["tested_checkpoint"] == "last (best.pt unreadable)"


def test_an_unwritable_run_dir_fails_before_training(mistakes):
    result = outcome(mistakes, "unwritable")
    assert result.returncode == 2
    assert "cannot write to --run-dir" in result.stdout
    assert "epoch 1" not in result.stdout


def test_an_unknown_flag_is_refused(mistakes):
    result = outcome(mistakes, "unknown_flag")
    assert result.returncode == 2
    assert "unrecognized arguments: --epoch" in result.stdout


# A line of a --config file: the message that refuses it.
CONFIG_FILE_MISTAKES = {
    'epochs = "ten"': "epochs must be a whole number, got 'ten'",
    "epochs = true": "epochs must be a whole number, got True",
    "lr = nan": "lr must be a finite number, got nan",
    'precision = "fp8"': "precision must be one of 'fp32', 'bf16', 'fp16', got 'fp8'",
    "epoch = 3": "'epoch' is no flag; its keys are the flags of --help, without the dashes",
    'config = "other.toml"': "a config file cannot name another",
    "global-batch-size = 32\nglobal_batch_size = 64": "'global-batch-size' and 'global_batch_size' set the same flag",
    "epochs = ": "is not valid TOML",
}


def test_a_config_file_sets_flags_and_the_command_line_wins(tmp_path):
    path = tmp_path / "base.toml"
    path.write_text('epochs = 7\nglobal-batch-size = 32\nlr = 1\nprecision = "bf16"\nprogress = false\n')
    from_file = parse_config(["--config", str(path)])
    assert (from_file.epochs, from_file.global_batch_size) == (7, 32)
    assert (from_file.precision, from_file.progress) == ("bf16", False)
    assert from_file.lr == 1.0 and isinstance(from_file.lr, float)
    assert from_file.config == str(path)  # config.json records the file
    overridden = parse_config(["--epochs", "2", "--config", str(path), "--lr", "0.02"])
    assert (overridden.epochs, overridden.lr, overridden.global_batch_size) == (2, 0.02, 32)


@pytest.mark.parametrize(("line", "message"), CONFIG_FILE_MISTAKES.items())
def test_a_mistake_in_a_config_file_is_one_line_naming_the_file(tmp_path, capsys, line, message):
    path = tmp_path / "base.toml"
    path.write_text(line + "\n")
    with pytest.raises(SystemExit) as exit_status:
        parse_config(["--config", str(path)])
    assert exit_status.value.code == 2
    error = capsys.readouterr().err
    assert f"{path}" in error and message in error and "Traceback" not in error


def test_a_missing_config_file_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--config", str(tmp_path / "missing.toml")])
    assert f"--config {tmp_path / 'missing.toml'}: no such file" in capsys.readouterr().err
