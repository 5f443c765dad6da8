"""Mistakes in flags, data and user files: one line naming what to fix, no traceback, nothing lost.

The failing runs start together (each is mostly TensorFlow's start-up and tracing) and are checked
one by one.
"""

import dataclasses
import json
import re
import subprocess

import keras
import pytest
import tensorflow as tf
from conftest import ZERO_LR, edited_sources, finish, run_training, start_training, summary
from project import final_split, split_sizes

from digits_mirrored.kit.checkpoint import ConfigState, written_by
from digits_mirrored.kit.config import TrainConfig, parse_config
from digits_mirrored.kit.contract import template_version
from digits_mirrored.kit.errors import ConfigError, RunError
from digits_mirrored.kit.stages import apply_as_given

ONE_EPOCH = ("--epochs", "1", "--global-batch-size", "40")
SPLITS = "    return make_split(1007), make_split(251), make_split(257)"
# A loss.py mistake reaches the loop through the default train_step, which hands the loss on as it is.
DEFAULT_STEP = "    return Mean(per_sample_loss(model(inputs, training=True), targets))"

# name: (file, old, new) edits of the default sources, each a mistake a user makes.
MISTAKES = {
    "wrong_shape": ("data.py", "inputs.astype(np.float32)", "inputs[:, 1:].astype(np.float32)"),
    "label_out_of_range": (
        "data.py",
        "targets.astype(np.int32)",
        "np.where(np.arange(size) == size - 2, 9, targets).astype(np.int32)",
    ),
    "averaged_loss": (
        "loss.py",
        "return keras.losses.sparse_categorical_crossentropy(targets, tf.cast(outputs, tf.float32), from_logits=True)",
        "return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(targets, outputs, from_logits=True))",
    ),
    "metric_named_loss": ("metrics.py", 'return {"accuracy": ', 'return {"loss": '),
    "integer_loss": (
        "loss.py",
        "return keras.losses.sparse_categorical_crossentropy(targets, tf.cast(outputs, tf.float32), from_logits=True)",
        "return tf.cast(tf.argmax(outputs, axis=-1, output_type=tf.int32) != targets, tf.int32)",
    ),
    "two_datasets": ("data.py", SPLITS, "    return make_split(1007), make_split(251)"),
    "optimizer_typo": ("optim.py", "weight_decay=config.weight_decay,", "weight_decay=config.weight_decays,"),
    # Evaluation batches (any but the global batch of 40 these runs train on) that lose a sample each.
    "eval_batches_lose_samples": (
        "data.py",
        "    return dataset.batch(batch_size)\n",
        "    batches = dataset.batch(batch_size)\n"
        "    def drop_first(*batch):  # of each part of the batch, for (inputs, targets) and dict batches alike\n"
        "        return tf.nest.map_structure(lambda part: part[1:], batch[0] if len(batch) == 1 else batch)\n\n"
        "    return batches.map(drop_first) if batch_size != 40 else batches\n",
    ),
    # A function given to tf.data that takes the batch's parts as a tuple and reads it as a tensor.
    "make_batches_typo": (
        "data.py",
        "    return dataset.batch(batch_size)\n",
        "    return dataset.batch(batch_size).map(lambda *batch: batch.shape)\n",
    ),
    "nan_test_data": (
        "data.py",
        SPLITS,
        "    test = make_split(257).map(lambda x, y: (tf.where(tf.reduce_sum(x) > 4, x * np.nan, x), y))\n"
        "    return make_split(1007), make_split(251), test",
    ),
    "nan_val_data": (
        "data.py",
        SPLITS,
        "    val = make_split(251).map(lambda x, y: (tf.where(tf.reduce_sum(x) > 4, x * np.nan, x), y))\n"
        "    return make_split(1007), val, make_split(257)",
    ),
    # An op that has no XLA kernel (Python code run through tf.numpy_function), trained with --jit-compile.
    "not_for_xla": (
        "step.py",
        DEFAULT_STEP,
        "    import tensorflow as tf\n\n"
        "    as_is = tf.numpy_function(lambda array: array, [inputs], inputs.dtype, stateful=False)\n"
        "    inputs = tf.ensure_shape(as_is, inputs.shape)\n" + DEFAULT_STEP,
    ),
}
MISTAKES |= {
    # A shape computed from the data's values, which XLA cannot compile.
    "shape_from_values": (
        "step.py",
        DEFAULT_STEP,
        "    import tensorflow as tf\n\n"
        "    losses = per_sample_loss(model(inputs, training=True), targets)\n"
        "    return Mean(tf.reshape(losses, [tf.reduce_sum(tf.cast(losses > -1.0, tf.int32))]))",
    ),
    # A Python `if` on a tensor's value: step.py is traced as plain Python, with no AutoGraph to rewrite it.
    "if_on_a_tensor": (
        "step.py",
        DEFAULT_STEP,
        "    import tensorflow as tf\n\n"
        "    if tf.reduce_max(inputs) > 100.0:\n"
        "        inputs = inputs / 100.0\n" + DEFAULT_STEP,
    ),
    # A generator of losses (two of them) for the one optimizer.
    "two_losses": (
        "step.py",
        DEFAULT_STEP,
        "    loss = Mean(per_sample_loss(model(inputs, training=True), targets))\n"
        '    yield "model", loss\n'
        '    yield "model", loss',
    ),
}
# Flags of the runs above besides ONE_EPOCH: these three train with XLA.
MISTAKE_FLAGS = {name: ("--jit-compile",) for name in ("not_for_xla", "shape_from_values", "two_losses")}


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    """The runs of the edits above, started together: by name, the run's output, or the skip of an
    edit whose code you have replaced (the test of that edit skips)."""
    root = tmp_path_factory.mktemp("mistakes")
    started, skipped = {}, {}
    with pytest.MonkeyPatch.context() as patch:
        # oneDNN's fused ReLU (TensorFlow's default on the CPU) turns a NaN input into 0, so NaN
        # data could leave the loss finite here; without oneDNN the NaN reaches the loss.
        patch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
        for name, (file, old, new) in MISTAKES.items():
            try:
                sources = edited_sources(root / f"{name}_src", file, old, new)
                if file == "loss.py":
                    edited_sources(root / f"{name}_step", "step.py", DEFAULT_STEP, DEFAULT_STEP)
            except pytest.skip.Exception as skip:
                skipped[name] = skip
                continue
            started[name] = start_training(root / name, *ONE_EPOCH, *MISTAKE_FLAGS.get(name, ()), sources=sources)
    too_large = str(2 * split_sizes()[0])
    started["too_large_batch"] = start_training(root / "too_large_batch", "--global-batch-size", too_large)
    return root, {**{name: finish(training, expect_success=False) for name, training in started.items()}, **skipped}


def outcome(mistakes, name: str) -> subprocess.CompletedProcess:
    """The output of the run `name` of the `mistakes` fixture; skips the test if its edit no longer applies."""
    _, results = mistakes
    if isinstance(results[name], pytest.skip.Exception):
        raise results[name]
    return results[name]


def test_config_rejects_out_of_range_values():
    with pytest.raises(ConfigError, match="--seed must be between 0 and 2147483647"):
        TrainConfig(seed=-1).validate()
    with pytest.raises(ConfigError, match="--shuffle-buffer must be at most"):
        TrainConfig(shuffle_buffer=10**20).validate()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--lr", "nan"), "argument --lr: invalid finite float value: 'nan'"),
        (("--max-grad-norm", "inf"), "argument --max-grad-norm: invalid finite float value: 'inf'"),
        (("--seed", "1e23"), "argument --seed: invalid int value: '1e23'"),
        (("--seed", "-1"), "--seed must be between 0 and 2147483647, got -1"),
        (("--lr", "1e-3", "--min-lr", "0.01"), "--min-lr 0.01 is above --lr 0.001: the schedule decays from --lr"),
        (("--min-lr", "1e-4", "--schedule", "constant"), "--min-lr is where the cosine schedule ends; --schedule"),
    ],
)
def test_bad_flag_values_are_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_status:
        parse_config(list(flags))
    assert exit_status.value.code == 2
    assert message in capsys.readouterr().err


def test_a_global_batch_larger_than_the_train_set_is_refused(mistakes):
    result = outcome(mistakes, "too_large_batch")
    assert result.returncode == 2 and "Traceback" not in result.stdout
    expected = f"--global-batch-size {2 * split_sizes()[0]} is larger than the train set ({split_sizes()[0]} samples)"
    assert expected + "; lower it, or add data" in result.stdout


def test_a_wrong_input_shape_names_the_file_to_fix(mistakes):
    result = outcome(mistakes, "wrong_shape")
    assert result.returncode == 1 and "Traceback" not in result.stdout
    assert "step.py:" in result.stdout and "failed in train_step: ValueError:" in result.stdout


def test_an_out_of_range_label_deep_in_the_data_is_one_line(mistakes):
    # Sample 1005 of 1007 has the label 9 of 4 classes: TensorFlow refuses it inside the compiled step.
    result = outcome(mistakes, "label_out_of_range")
    assert result.returncode == 1 and "Traceback" not in result.stdout
    assert "error: a batch was refused (" in result.stdout and "which is outside the valid range" in result.stdout


def test_what_xla_cannot_compile_is_named_with_its_line_under_jit_compile(mistakes):
    for name, problem in [
        ("not_for_xla", "XLA cannot compile PyFuncStateless; replace what creates it"),
        ("shape_from_values", "must be a compile-time constant: XLA needs shapes that do not depend on the data"),
    ]:
        result = outcome(mistakes, name)
        assert result.returncode == 1 and "Traceback" not in result.stdout
        assert re.search(r"error: --jit-compile: step\.py:\d+: .*" + re.escape(problem), result.stdout), name


def test_a_generator_step_for_one_optimizer_is_refused_under_jit_compile(mistakes):
    # XLA compiles the whole micro-step, step.py with it: the check runs inside.
    result = outcome(mistakes, "two_losses")
    assert result.returncode == 1 and "Traceback" not in result.stdout
    problem = "train_step must return a Mean for 'model', got a generator (yield losses only when optim.py returns"
    assert problem in result.stdout, result.stdout


def test_an_averaged_loss_is_refused(mistakes):
    result = outcome(mistakes, "averaged_loss")
    assert result.returncode == 1 and "Traceback" not in result.stdout
    assert "step.py:" in result.stdout and "Mean() takes one value per sample" in result.stdout


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("integer_loss", r"the 'model' loss from train_step is int32, which has no gradient; return a floating "),
        ("two_datasets", r"data\.py: build_datasets must return \(train, val, test\) datasets, got a tuple of 2$"),
        ("eval_batches_lose_samples", r"data\.py: make_batches gave \d+ of the val set's \d+ samples; keep every"),
        (
            "make_batches_typo",
            r"data\.py:\d+ failed in make_batches on the val set: AttributeError: ",
        ),
        (
            "if_on_a_tensor",
            r"step\.py:\d+ failed in train_step: a tensor used as a Python bool or iterated over; the step is traced "
            r"once as plain Python, so decide on a tensor with tf\.where or tf\.cond",
        ),
        (
            "optimizer_typo",
            r"optim\.py:\d+ failed building the optimizer: AttributeError: 'TrainConfig' object has no attribute "
            r"'weight_decays'$",
        ),
    ],
)
def test_a_wrong_value_from_a_user_file_is_one_line(mistakes, name, message):
    result = outcome(mistakes, name)
    assert result.returncode == 1 and "Traceback" not in result.stdout
    assert re.search("^error: " + message, result.stdout, re.MULTILINE), result.stdout


def test_a_metric_named_loss_is_refused(mistakes):
    result = outcome(mistakes, "metric_named_loss")
    assert result.returncode == 1 and "Traceback" not in result.stdout
    assert "metrics.py returns a metric named 'loss', which would replace the loss; rename the metric" in result.stdout


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
    assert not list((root / "nan_val_data" / "checkpoints").glob("*.index"))


def test_a_damaged_best_checkpoint_tests_the_last_weights(tmp_path):
    # With a zero learning rate epoch 1 stays the best, so best/ does not hold the newest checkpoint.
    if final_split() == "val":
        pytest.skip("data.py builds no test set: the run tests no checkpoint")
    run_training(tmp_path, *ONE_EPOCH, "--epochs", "2", *ZERO_LR, "--stop-after-epoch", "1")
    for data in (tmp_path / "checkpoints" / "best").glob("best-1.data-*"):
        data.write_bytes(b"not a checkpoint")
    result = run_training(tmp_path, *ONE_EPOCH, "--epochs", "2", *ZERO_LR, "--resume")
    assert "warning: cannot load the best checkpoint" in result.stdout
    assert summary(tmp_path)["tested_checkpoint"] == "last (best unreadable)"


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


def test_a_checkpoint_names_the_template_version_that_wrote_it(tmp_path):
    """A checkpoint this loop cannot continue is refused naming the version that wrote it (Checkpointer)."""
    state = ConfigState(TrainConfig())
    now = tf.train.Checkpoint(config=state).write(str(tmp_path / "now"))
    version = template_version()
    assert written_by(now) == (f"template version {version}" if version else "an older version of the template")
    state.text = json.dumps(dataclasses.asdict(TrainConfig()))  # as checkpoints were before they recorded it
    older = tf.train.Checkpoint(config=state).write(str(tmp_path / "older"))
    assert written_by(older) == "an older version of the template"
    state.text = json.dumps({**dataclasses.asdict(TrainConfig()), "template_version": "0123abc"})
    assert written_by(tf.train.Checkpoint(config=state).write(str(tmp_path / "named"))) == "template version 0123abc"


def test_an_optimizer_applies_the_summed_gradients_as_given_or_the_run_is_refused():
    # The loop sums the gradients over the replicas itself, so Keras' own sum is turned off (test_distributed
    # checks the weights); a Keras without the method that sums is refused before an update R times too big.
    optimizer = keras.optimizers.SGD(0.1)
    apply_as_given(optimizer)
    grad, variable = tf.ones([2]), tf.Variable(tf.zeros([2]))
    [(kept, _)] = optimizer._all_reduce_sum_gradients([(grad, variable)])
    assert kept is grad  # not a sum over the replicas (a new tensor, even with one replica)

    class KerasWithoutIt(keras.optimizers.SGD):
        _all_reduce_sum_gradients = None

    with pytest.raises(RunError, match=r"^keras .* has no optimizer._all_reduce_sum_gradients, which this loop"):
        apply_as_given(KerasWithoutIt(0.1))


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
