"""The user contract of the TensorFlow template holds for the shapes people train: a padded,
token-weighted language model; a GAN with two optimizers and a frozen judge; a contrastive loss
that needs every replica's embeddings; Gather rows back in dataset order.

Each runs a `--strategy mirrored` project on 1 and on 2 logical CPU replicas: N replicas must train
exactly like one with the same global batch, and each equivalence test also shows that it would
catch the bug it is about (a naive variant that must fail it).
"""

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    REPO_ROOT,
    SUBSET_FLAGS,
    TENSORFLOW,
    answers,
    check_subset_runs,
    copy_project,
    doc_blocks,
    edit,
    in_parallel,
    looptpl,
    records,
    relative_difference,
    run,
    write_blocks,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("sklearn") is None,
        reason="needs TensorFlow and scikit-learn: pip install tensorflow-cpu scikit-learn",
    ),
]

GAN = REPO_ROOT / "examples" / "tf-gan-mirrored"
# Relative difference of the trained weights allowed between 1 and 2 replicas: float noise is ~1e-7.
TOLERANCE = 1e-5
ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "TF_NUM_INTRAOP_THREADS": "1"}


def train_tf(project: Path, run_dir: Path, *flags: str, replicas: int = 1, expect_success: bool = True) -> str:
    """Train a mirrored project on `replicas` logical CPU devices; returns its output."""
    module = ["-m", f"{answers(project)['package_name']}.train", "--run-dir", str(run_dir), "--no-progress"]
    environment = {**ENVIRONMENT, "PYTHONPATH": str(project / "src")}
    command = [sys.executable, *module, "--cpu-replicas", str(replicas), *flags]
    result = run(command, cwd=project, env=environment, preload=TENSORFLOW)
    assert (result.returncode == 0) == expect_success, result.stdout[-5000:]
    return result.stdout


def tf_weights(run_dir: Path) -> dict[str, np.ndarray]:
    """The trained weights in a run's newest checkpoint, by checkpoint name."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    names = reader.get_variable_to_dtype_map()
    return {name: reader.get_tensor(name) for name in names if "_trainable_variables/" in name}


def mirrored_project(root: Path, name: str) -> Path:
    project = root / name
    result = looptpl("new", str(project), "--backend", "tensorflow", "--strategy", "mirrored", "--no-git")
    assert result.exit_code == 0, result.stderr
    return project


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    project = mirrored_project(tmp_path_factory.mktemp("tf_lm"), "lm")
    write_blocks(project, doc_blocks("TensorFlow: token-level language model"))
    return project


TINY_LM = ("--epochs", "1", "--schedule", "constant", "--warmup-steps", "0")


@pytest.fixture(scope="module")
def lm_runs(lm, tmp_path_factory) -> dict[str, Path]:
    """The language model on one replica, and on 2 replicas with accumulation, plain and under XLA:
    the three runs the equivalence tests below compare, trained side by side."""
    root = tmp_path_factory.mktemp("lm_runs")
    in_parallel(
        lambda: train_tf(lm, root / "one", *TINY_LM),
        lambda: train_tf(lm, root / "two", *TINY_LM, "--grad-accum-steps", "2", replicas=2),
        lambda: train_tf(lm, root / "xla", *TINY_LM, "--grad-accum-steps", "2", "--jit-compile", replicas=2),
    )
    return {name: root / name for name in ("one", "two", "xla")}


def test_token_weighted_loss_is_exact_over_replicas_and_micro_steps(lm_runs):
    # Functions of 48-160 bytes, padded per replica batch: the update is only right if the engine
    # divides by the real tokens of all replicas and micro-steps together.
    assert relative_difference(tf_weights(lm_runs["one"]), tf_weights(lm_runs["two"])) < TOLERANCE
    one, two = records(lm_runs["one"])[-1], records(lm_runs["two"])[-1]
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-5)
    assert one["val_tokens"] == two["val_tokens"] > 51 * 40  # every real token of the split, counted once
    assert one["val_perplexity"] == pytest.approx(math.exp(one["val_loss"]))


def test_jit_compile_trains_padded_batches_of_every_length_like_the_graph(lm_runs):
    # XLA compiles each micro-step once per shape: every padded length, the short last batch. On 2
    # replicas with accumulation it must still give the update of one uncompiled replica.
    assert relative_difference(tf_weights(lm_runs["one"]), tf_weights(lm_runs["xla"])) < TOLERANCE
    assert records(lm_runs["xla"])[-1]["val_loss"] == pytest.approx(records(lm_runs["one"])[-1]["val_loss"])


def test_token_windows_train_alike_on_one_and_two_replicas_and_resume_exactly(lm, tmp_path):
    # docs/todos.md's token windows in the language model: a sample is a window's offset, and make_batches
    # gathers the windows; epochs of 6 updates from each epoch's shuffle, validation on 2 fixed batches.
    # 1 replica, and 2 replicas with accumulation stopped mid-epoch 2 then resumed, train the same weights.
    project = copy_project(lm, tmp_path / "windows")
    write_blocks(project, doc_blocks("TensorFlow: token windows"))
    flags = ("--epochs", "2", "--steps-per-epoch", "6", "--eval-batches", "2", "--eval-batch-size", "16")
    flags += ("--corpus-bytes", "60000", "--width", "32", "--global-batch-size", "16", "--warmup-steps", "2")
    one, two = tmp_path / "one", tmp_path / "two"
    in_parallel(
        lambda: train_tf(project, one, *flags),
        lambda: train_tf(project, two, *flags, "--grad-accum-steps", "2", "--stop-after-step", "9", replicas=2),
    )
    train_tf(project, two, *flags, "--grad-accum-steps", "2", "--resume", replicas=2)
    assert relative_difference(tf_weights(one), tf_weights(two)) < TOLERANCE
    assert [record["step"] for record in records(one)] == [record["step"] for record in records(two)] == [6, 12]
    assert all(record["val_tokens"] == 2 * 16 * 64 for record in records(one) + records(two))
    summary = json.loads((two / "summary.json").read_text())
    assert summary["val_loss"] == pytest.approx(records(one)[summary["best_epoch"] - 1]["val_loss"], rel=1e-5)


def test_a_mean_of_micro_batch_means_fails_the_same_check(lm, tmp_path):
    # The bug of transformers#34242: each micro-batch averaged over its own tokens, then averaged.
    naive = copy_project(lm, tmp_path / "naive")
    edit(
        naive,
        "step.py",
        '    return Mean(losses, weights=mask, per="token")\n\n\ndef eval_step',
        "    return Mean(tf.reshape(tf.reduce_sum(losses * mask) / tf.reduce_sum(mask), [1]))\n\n\ndef eval_step",
    )
    in_parallel(
        lambda: train_tf(naive, tmp_path / "one", *TINY_LM),
        lambda: train_tf(naive, tmp_path / "two", *TINY_LM, "--grad-accum-steps", "2", replicas=2),
    )
    assert relative_difference(tf_weights(tmp_path / "one"), tf_weights(tmp_path / "two")) > 10 * TOLERANCE


@pytest.fixture(scope="module")
def gan(tmp_path_factory) -> Path:
    return copy_project(GAN, tmp_path_factory.mktemp("tf_gan") / "project")


GAN_RUN = ("--epochs", "2", "--global-batch-size", "64")
# One epoch for 1 vs 2 replicas: the runs then differ by float noise (6e-8); the game of a second
# epoch amplifies that noise to 4e-4, the size of a real bug.
GAN_EPOCH = ("--epochs", "1", "--global-batch-size", "64")


def test_gan_trains_both_networks_alike_on_two_replicas_with_accumulation(gan, tmp_path):
    in_parallel(
        lambda: train_tf(gan, tmp_path / "one", *GAN_EPOCH),
        lambda: train_tf(gan, tmp_path / "two", *GAN_EPOCH, "--grad-accum-steps", "2", replicas=2),
    )
    one, two = tf_weights(tmp_path / "one"), tf_weights(tmp_path / "two")
    # Both trained networks, and not the frozen judge (its 1257 stored images are no trainable weight).
    assert {name.split("/")[1] for name in one} == {"discriminator", "generator"}
    assert relative_difference(one, two) < TOLERANCE
    record = records(tmp_path / "two")[-1]
    assert {"train_discriminator_loss", "train_generator_loss", "val_diversity"} <= record.keys()
    steps = [json.loads(line) for line in (tmp_path / "two" / "steps.jsonl").read_text().splitlines()]
    assert {"grad_norm_discriminator", "grad_norm_generator"} <= steps[-1].keys()
    # 1257 = 19 x 64 + 41: the short last batch is kept (41 samples for 2 replicas x 2 micro-steps).
    assert record["step"] == 20


def test_jit_compile_with_two_optimizers_is_refused_in_one_line(gan, tmp_path):
    output = train_tf(gan, tmp_path / "run", *GAN_EPOCH, "--jit-compile", expect_success=False)
    assert output.strip().splitlines()[-1] == (
        "error: --jit-compile compiles the step of one optimizer, and optim.py builds 2 (discriminator, generator); "
        "train without --jit-compile"
    )


def test_gan_with_a_loss_summed_per_micro_batch_fails_the_same_check(gan, tmp_path):
    # The generator's loss as one sum per micro-batch (a loss written for one replica, to be divided
    # by the batch later): right on one replica, scaled by the micro-batches' number on two.
    naive = copy_project(gan, tmp_path / "naive")
    judged = "scored_as(discriminator([drawn, label], training=True), real=True)"
    edit(
        naive,
        "step.py",
        f'yield "generator", Mean({judged})',
        f'yield "generator", Mean(tf.reshape(tf.reduce_sum({judged}), [1]))',
    )
    in_parallel(
        lambda: train_tf(naive, tmp_path / "one", *GAN_EPOCH),
        lambda: train_tf(naive, tmp_path / "two", *GAN_EPOCH, "--grad-accum-steps", "2", replicas=2),
    )
    assert relative_difference(tf_weights(tmp_path / "one"), tf_weights(tmp_path / "two")) > 10 * TOLERANCE


def test_gan_resume_from_a_step_checkpoint_with_two_optimizers_equals_an_uninterrupted_run(gan, tmp_path):
    # 20 updates an epoch: stopped after update 27, part-way through epoch 2, with both networks'
    # optimizers and running losses in the checkpoint.
    def stopped_and_resumed() -> str:
        train_tf(gan, tmp_path / "resumed", *GAN_RUN, "--stop-after-step", "27")
        return train_tf(gan, tmp_path / "resumed", *GAN_RUN, "--resume")

    _, resumed = in_parallel(lambda: train_tf(gan, tmp_path / "straight", *GAN_RUN), stopped_and_resumed)
    assert "resumed after update 27, part-way through epoch 2 (update 7 of 20)" in resumed
    assert relative_difference(tf_weights(tmp_path / "straight"), tf_weights(tmp_path / "resumed")) == 0
    timeless = [{**record, "epoch_time_s": 0} for record in records(tmp_path / "straight")]
    assert [{**record, "epoch_time_s": 0} for record in records(tmp_path / "resumed")] == timeless


@pytest.mark.parametrize("gather", ["with-grad", "local-only"])
def test_a_contrastive_loss_over_every_replica_trains_like_one_replica(tmp_path, gather):
    project = mirrored_project(tmp_path, "contrastive")
    blocks = doc_blocks("TensorFlow: contrastive")
    write_blocks(project, {"step.py": blocks["step.py"]})
    write_blocks(
        project, {"data.py": blocks["data.py"], "settings.py": blocks["settings.py"]}, append=("data.py", "settings.py")
    )
    if gather == "local-only":  # the naive version: each replica's negatives are its own samples only
        edit(project, "step.py", "gather_with_grad(second)", "(second, 0)")
    flags = ("--epochs", "2", "--global-batch-size", "32")
    in_parallel(
        lambda: train_tf(project, tmp_path / "one", *flags),
        lambda: train_tf(project, tmp_path / "two", *flags, replicas=2),
    )
    difference = relative_difference(tf_weights(tmp_path / "one"), tf_weights(tmp_path / "two"))
    if gather == "with-grad":
        assert difference < TOLERANCE
        # Several updates per call could pair one replica's gather with another's next one: refused.
        output = train_tf(
            project, tmp_path / "looped", *flags, "--steps-per-call", "4", replicas=2, expect_success=False
        )
        assert "gather_with_grad needs one update per call on several replicas: run with --steps-per-call 1" in output
        assert "Traceback" not in output
    else:
        assert difference > 10 * TOLERANCE


GATHERED_TARGETS = """

def batch_metrics(outputs: tf.Tensor, targets: tf.Tensor) -> dict[str, Mean | Gather]:
    predictions = tf.argmax(outputs, axis=1, output_type=targets.dtype)
    return {"accuracy": Mean(tf.cast(predictions == targets, tf.float32)), "targets": Gather(targets)}


def dataset_metrics(means: dict[str, float], gathered: dict[str, np.ndarray]) -> dict[str, float]:
    from .config import TrainConfig
    from .data import build_datasets

    val = np.array([int(target) for _, target in build_datasets(TrainConfig())[1]])
    return {"targets_in_order": float(np.array_equal(gathered["targets"], val))}
"""


def test_gathered_rows_come_back_in_dataset_order_from_every_replica(tmp_path):
    # 251 validation samples in batches of 16 per replica: the replicas' last batches are short or
    # empty, and the rows of each batch arrive replica by replica.
    project = mirrored_project(tmp_path, "gathered")
    write_blocks(project, {"metrics.py": GATHERED_TARGETS}, append=("metrics.py",))
    train_tf(project, tmp_path / "run", "--epochs", "1", "--eval-batch-size", "16", replicas=2)
    record = records(tmp_path / "run")[-1]
    assert record["val_targets_in_order"] == 1.0 and record["val_samples"] == 251


def test_steps_per_epoch_eval_batches_and_no_test_set_on_one_and_two_replicas_with_resume(tmp_path):
    # Epochs of 4 updates (--steps-per-epoch), each from its own shuffle of the train set; 1 and 2
    # replicas train the same updates. data.py gives no test set; --eval-batches 5 of 16 evaluates 80 of
    # the 251 val samples. metrics.py sees their targets, gathered from every replica: the same 80 (not the
    # first 80) at every evaluation, on 1 and 2 replicas. --monitor-mode max makes epoch 1 the best, before
    # the 2-replica run stops and resumes: the summary gives that epoch's val figures, which the checkpoint
    # must have kept.
    project = mirrored_project(tmp_path, "subset")
    edit(project, "data.py", "make_split(251), make_split(257)", "make_split(251), None")
    write_blocks(project, {"metrics.py": GATHERED_TARGETS}, append=("metrics.py",))
    code = '"targets_code": float(hash(tuple(gathered["targets"].tolist())) % 2**40), "targets_in_order"'
    edit(project, "metrics.py", '"targets_in_order"', code)
    edit(project, "metrics.py", "build_datasets(TrainConfig())[1]])", "build_datasets(TrainConfig())[1]][:80])")
    in_parallel(
        lambda: train_tf(project, tmp_path / "one", *SUBSET_FLAGS),
        lambda: train_tf(project, tmp_path / "two", *SUBSET_FLAGS, "--stop-after-epoch", "2", replicas=2),
    )
    train_tf(project, tmp_path / "two", *SUBSET_FLAGS, "--resume", replicas=2)
    check_subset_runs(tmp_path, "val_targets_code", "val_targets_in_order")
