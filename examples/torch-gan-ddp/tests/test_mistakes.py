"""Mistakes in flags, data and user files: one line naming what to fix, no traceback, nothing lost.

The failing runs start together in the `mistakes` fixture (each is mostly Python's and torch's
start-up) and are checked one by one.
"""

import math
import re
import subprocess

import pytest
import torch
from conftest import (
    ZERO_LR,
    edited_sources,
    finish,
    run_training,
    start,
    start_training,
    summary,
    training_command,
)
from project import final_split, split_sizes
from torch.utils.data import default_collate

from gan_ddp.kit.config import TrainConfig, parse_config
from gan_ddp.kit.errors import ConfigError, DataError
from gan_ddp.kit.loaders import checked_collate
from gan_ddp.kit.sampling import Samples

SPLITS = "    return make_split(1003), make_split(251), make_split(257)"
# The loss.py mistakes reach the loop through the default train_step, which hands the loss on as it is.
DEFAULT_STEP = "    return Mean(per_sample_loss(model(inputs), targets))"
ITEM = "        return TensorDataset(inputs, targets)"
ONE = torch.ones(3)
# model.py for distillation, a student and its teacher, while optim.py is still written for one model.
TWO_MODELS = (
    "def build_model(config: TrainConfig) -> dict[str, nn.Module]:\n"
    '    return {"student": build_network(config), "teacher": build_network(config)}\n\n\n'
    "def build_network(config: TrainConfig) -> nn.Module:"
)

# flags: the message that refuses them.
BAD_FLAGS = {
    ("--lr", "nan"): "argument --lr: invalid finite float value: 'nan'",
    ("--weight-decay", "inf"): "argument --weight-decay: invalid finite float value: 'inf'",
    ("--seed", "1e23"): "argument --seed: invalid int value: '1e23'",
    ("--seed", "-1"): "--seed must be between 0 and 2**32 - 1 (4294967295), got -1",
    ("--seed", "4294967296"): "--seed must be between 0 and 2**32 - 1 (4294967295), got 4294967296",
    ("--lr", "1e-3", "--min-lr", "0.01"): "--min-lr 0.01 is above --lr 0.001: the schedule decays from --lr down",
    ("--min-lr", "1e-4", "--schedule", "constant"): "--min-lr is where the cosine schedule ends; --schedule constant",
}

# name: (file, old, new, message): an edit of a user file that the run refuses with the message (a
# string it contains, or a pattern it matches).
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
    "integer-loss": (
        "loss.py",
        'F.cross_entropy(outputs.float(), targets, reduction="none")',
        "(outputs.argmax(dim=1) != targets).long()",
        "the 'model' loss from train_step is torch.int64, which has no gradient; return a floating point loss",
    ),
    "two-datasets": (
        "data.py",
        SPLITS,
        "    return make_split(1003), make_split(251)",
        "error: data.py: build_datasets must return (train, val, test) datasets, got a tuple of 2",
    ),
    "no-val-set": (
        "data.py",
        SPLITS,
        "    return make_split(1003), None, make_split(257)",
        "error: data.py: build_datasets returned None for the val set; only the test set may be None (the run then "
        "has no final test)",
    ),
    "negative-length": (
        "data.py",
        ITEM,
        "        class Sized(TensorDataset):\n"
        "            def __len__(self) -> int:\n"
        "                return size - 2000\n\n"
        "        return Sized(inputs, targets)",
        re.compile(r"error: data\.py:\d+: the train dataset's __len__ returned -997; "),
    ),
    "yield-for-one-optimizer": (
        "step.py",
        "    return Mean(per_sample_loss(model(inputs), targets))",
        '    yield "model", Mean(per_sample_loss(model(inputs), targets))',
        "train_step must return a Mean for 'model', got a generator (yield losses only when optim.py returns several",
    ),
    "optimizer-for-one-model": (
        "model.py",
        "def build_model(config: TrainConfig) -> nn.Module:",
        TWO_MODELS,
        re.compile(
            r"error: optim\.py:\d+ failed building the optimizer: AttributeError: 'dict' object has no attribute "
            r"'parameters'; model\.py returns a dict of models"
        ),
    ),
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
        ITEM,
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
    "string_label": (
        "data.py",
        ITEM,
        "        items = list(zip(inputs, targets, strict=True))\n"
        '        items[min(500, size - 1)] = (inputs[0], "cat")\n'
        "        return items  # type: ignore[return-value]",
    ),
    "missing_key": (
        "data.py",
        ITEM,
        '        items = [{"inputs": x, "targets": y} for x, y in zip(inputs, targets, strict=True)]\n'
        '        del items[min(500, size - 1)]["targets"]\n'
        "        return items  # type: ignore[return-value]",
    ),
    "nan_val_data": (
        "data.py",
        SPLITS,
        "    val = make_split(251)\n    val.tensors[0][3, 0] = float('nan')\n"
        "    return make_split(1003), val, make_split(257)",
    ),
}
# name: (file, old, new), a second edit of an edit above: step.py reads the dict items of missing_key.
DICT_BATCH = '    inputs, targets = batch["inputs"], batch["targets"]\n'
SECOND_EDITS = {"missing_key": ("step.py", "    inputs, targets = batch\n", DICT_BATCH)}


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    """The failing runs of the tests below, started together: by name, the run's output, or the
    skip of an edit whose code you have replaced (the test of that edit skips)."""
    root = tmp_path_factory.mktemp("mistakes")
    started = {}
    too_large = str(2 * split_sizes()[0])
    started["too_large_batch"] = start_training(root / "too_large_batch", "--global-batch-size", too_large)
    (root / "a-file").write_text("")
    started["unwritable"] = start(training_command(root / "a-file" / "run", "--epochs", "1"), root / "unwritable.log")
    skipped = {}
    for name, edit in EDITS.items():
        runs = [f"{name}_0", f"{name}_2"] if name == "sample_of_another_shape" else [name]
        try:
            sources = edited_sources(root / f"{name}_src", *edit)
            if name in SECOND_EDITS:
                sources = edited_sources(root / f"{name}_src2", *SECOND_EDITS[name], sources=sources)
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
def test_bad_flag_values_are_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_status:
        parse_config(list(flags))
    assert exit_status.value.code == 2
    assert message in capsys.readouterr().err


def test_a_global_batch_larger_than_the_train_set_is_refused(mistakes):
    result = outcome(mistakes, "too_large_batch")
    assert result.returncode == 2
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
    assert message.search(result.stdout) if isinstance(message, re.Pattern) else message in result.stdout, result.stdout
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
    assert re.search(
        r"error: data\.py: could not collate a batch: field \[0\] of the item at dataset index 500 has shape \[3\], "
        r"where the item at index \d+ has \[16\]; items of different shapes \(variable-length sequences\) need a "
        r"collate\(\) in data\.py that pads them",
        result.stdout,
    ), result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("string_label", r"field \[1\] of the item at dataset index 500 is the string 'cat', where the item at "),
        ("missing_key", r"the item at dataset index 500 has no key 'targets', which the item at index \d+ has; "),
    ],
)
def test_an_item_the_collate_cannot_batch_is_named_by_its_index(mistakes, name, problem):
    result = outcome(mistakes, name)
    assert result.returncode == 1
    assert re.search("error: data\\.py: could not collate a batch: " + problem, result.stdout), result.stdout
    assert "different shapes" not in result.stdout and "Traceback" not in result.stdout


# Items default_collate cannot batch, carrying the dataset indices 7, 17 and 27: what the error names.
UNBATCHABLE = {
    "fields": ([(ONE, 1), (ONE,), (ONE, 1)], "the item at dataset index 17 has 1 field, where the item at index 7 has"),
    "none": ([(ONE, None), (ONE, None)], "field [1] of the item at dataset index 7 is None, which default_collate"),
    "nested": (
        [{"a": {"b": ONE}}, {"a": {"b": ONE}}, {"a": {"b": ONE[:2]}}],
        "field ['a']['b'] of the item at dataset index 27 has shape [2], where the item at index 7 has [3]",
    ),
    "tokens": (
        [{"tokens": [1, 2]}, {"tokens": [1]}, {"tokens": [3, 4]}],
        "field ['tokens'] of the item at dataset index 17 is a list of 1, where the item at index 7 holds a list of 2",
    ),
}


@pytest.mark.parametrize(("items", "message"), UNBATCHABLE.values(), ids=UNBATCHABLE)
def test_the_collate_error_names_the_field_and_the_dataset_index(items, message):
    with pytest.raises(DataError, match=re.escape(f"data.py: could not collate a batch: {message}")):
        checked_collate(default_collate)(Samples(items, [7, 17, 27][: len(items)]))


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
    if final_split() == "val":
        pytest.skip("data.py builds no test set: the run tests no checkpoint")
    run_training(tmp_path, "--epochs", "2", *ZERO_LR, "--stop-after-epoch", "1")
    best = tmp_path / "checkpoints" / "best.pt"
    best.unlink()  # it is a hard link of epoch-0001.pt: replace it, do not damage the epoch checkpoint
    best.write_bytes(b"not a checkpoint")
    result = run_training(tmp_path, "--epochs", "2", *ZERO_LR, "--resume")
    assert "warning: cannot load" in result.stdout
    assert summary(tmp_path)["tested_checkpoint"] == "last (best.pt unreadable)"


def test_an_unwritable_run_dir_fails_before_training(mistakes):
    result = outcome(mistakes, "unwritable")
    assert result.returncode == 2
    assert "cannot write to --run-dir" in result.stdout
    assert "epoch 1" not in result.stdout


def test_an_unknown_flag_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_status:
        parse_config(["--epoch", "3"])
    assert exit_status.value.code == 2
    assert "unrecognized arguments: --epoch" in capsys.readouterr().err


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
    "lr = 1e400": "lr must be a finite number, got inf",
    f"lr = 1{'0' * 400}": "lr is too large for a float (over 1.8e308)",
    f"epochs = 1{'0' * 400}": "epochs is past the range of TOML's 64-bit integers",
    'monitor = "val\\u0000loss"': "monitor holds a NUL character",
    "epochs = -1": "epochs must be at least 1, got -1",
    "global-batch-size = 0": "global-batch-size must be at least 1, got 0",
    'run_dir = ""': "run_dir is empty: the run would go into the current folder; name a folder",
    'run_dir = "runs/{start}/{name}"': "run_dir may hold {start} once and no other braces, got 'runs/{start}/{name}'",
}


def test_the_projects_own_config_file_is_one_the_loop_reads():
    # `--config configs/base.toml`, as the generated README.md shows it: it exists, and as generated changes nothing.
    from conftest import PROJECT_ROOT

    path = PROJECT_ROOT / "configs" / "base.toml"
    assert path.is_file()
    assert {**vars(parse_config(["--config", str(path)])), "config": ""} == vars(parse_config([]))


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
    [error] = capsys.readouterr().err.splitlines()  # one line: no usage block, no traceback
    assert error.startswith(f"error: {path}: ") or error.startswith(f"error: --config {path} "), error
    assert message in error


def test_a_config_file_that_is_not_utf8_names_its_line(tmp_path, capsys):
    path = tmp_path / "base.toml"
    path.write_bytes(b'epochs = 3\nmonitor = "caf\xe9"\n')  # Latin-1, as some editors save
    with pytest.raises(SystemExit) as exit_status:
        parse_config(["--config", str(path)])
    assert exit_status.value.code == 2
    [error] = capsys.readouterr().err.splitlines()
    assert error == f"error: --config {path}: line 2 is not UTF-8 text (byte 0xe9); save the file as UTF-8"


def test_a_missing_config_file_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--config", str(tmp_path / "missing.toml")])
    assert f"--config {tmp_path / 'missing.toml'}: no such file" in capsys.readouterr().err
