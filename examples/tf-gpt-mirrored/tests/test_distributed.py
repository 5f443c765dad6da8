"""Two replicas (logical CPU devices) train exactly like one replica with the same global batch."""

import re

import pytest
from conftest import (
    TRAIN_FLAGS,
    ZERO_LR,
    assert_same_metrics,
    assert_same_weights,
    final_weights,
    finish,
    hook_calls,
    metrics,
    sources_with_a_conv_model,
    sources_with_a_nan_training_sample,
    sources_with_penalties,
    sources_with_recording_hooks,
    start_training,
    step_records,
    summary,
)
from project import evaluated_samples, final_split, final_test, resumed_message

from gpt_mirrored.kit.config import TrainConfig
from gpt_mirrored.kit.errors import ConfigError


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two-replica runs, started together; the resumed one continues as soon as its first part is done."""
    root = tmp_path_factory.mktemp("runs")
    stopped = (*TRAIN_FLAGS, "--checkpoint-every", "10")
    hooked = sources_with_recording_hooks(root / "hooks", stop_at=7)
    started = {
        "two": start_training(root / "two", *TRAIN_FLAGS, replicas=2),
        "two_accum": start_training(root / "two_accum", *TRAIN_FLAGS, "--grad-accum-steps", "2", replicas=2),
        # Stopped part-way through epoch 2 (26 updates an epoch with the template's data), checkpointed at 30.
        # In a folder of its own under resumed/ ({start}), which --resume then finds.
        "resumed": start_training(root / "resumed" / "{start}", *stopped, "--stop-after-step", "37", replicas=2),
        # With a zero learning rate the validation loss never improves after the first epoch.
        "early": start_training(root / "early", "--epochs", "6", *ZERO_LR, "--early-stop-patience", "1", replicas=2),
        "nan": start_training(root / "nan", "--epochs", "2", "--lr", "1e30", "--max-grad-norm", "0", replicas=2),
        # The last replica's hooks ask to stop once update 7 is done: the run ends after update 8.
        "hooked": start_training(root / "hooked", *TRAIN_FLAGS, "--log-every", "4", sources=hooked, replicas=2),
    }
    # The stopped run ends first, and is resumed while the others go on.
    results = {"resumed": finish(started.pop("resumed"))}
    resume = start_training(root / "resumed" / "{start}", *stopped, "--resume", replicas=2)
    results |= {name: finish(training, expect_success=name != "nan") for name, training in started.items()}
    results["resume"] = finish(resume)
    return root, results


@pytest.fixture(scope="module")
def skipping(tmp_path_factory):
    """A Conv2D model (on short batches, and on a last validation batch of one sample) and a NaN
    training sample (whose update every replica must skip alike), with --nan-policy skip, on two
    replicas and on one."""
    root = tmp_path_factory.mktemp("skipping")
    sources = sources_with_a_nan_training_sample(root / "nan_sample", sources_with_a_conv_model(root / "conv"))
    # 125 samples per replica: the 251 validation samples end in a batch of one for two replicas.
    flags = (*TRAIN_FLAGS, "--eval-batch-size", "125", "--nan-policy", "skip", "--grad-accum-steps", "2")
    started = [
        start_training(root / "two", *flags, sources=sources, replicas=2),
        start_training(root / "one", *flags, sources=sources),
    ]
    for training in started:
        finish(training)
    return root


@pytest.mark.parametrize("variant", ["two", "two_accum"])
def test_two_replicas_match_one(reference, runs, variant):
    # The short last batch (7 samples) is split unevenly over replicas and micro-steps: it must
    # still give the same update as on one replica.
    root, _ = runs
    assert_same_weights(final_weights(reference), final_weights(root / variant), atol=1e-5)
    assert_same_metrics(metrics(reference), metrics(root / variant), rel=1e-4)
    # The norm of the global gradient, summed over the replicas, before clipping.
    norms = [record["grad_norm"] for record in step_records(reference)]
    assert [record["grad_norm"] for record in step_records(root / variant)] == pytest.approx(norms, rel=1e-4)


def test_evaluation_counts_every_sample_once(reference, runs):
    root, _ = runs
    for record in metrics(root / "two"):
        assert record["val_samples"] == evaluated_samples("val")
    split = final_split()  # "test", or "val" where data.py builds no test set
    assert final_test(root / "two")[f"{split}_samples"] == evaluated_samples(split)
    assert final_test(root / "two") == pytest.approx(final_test(reference), rel=1e-5)


def test_resume_on_two_replicas_matches_an_uninterrupted_run(runs):
    root, results = runs
    # The run's folder, named by its start; `latest` beside it is a link to it.
    [resumed] = [folder for folder in (root / "resumed").iterdir() if folder.is_dir() and not folder.is_symlink()]
    assert resumed_message(37) in results["resume"].stdout
    assert f"run folder   {resumed}  (took " in results["resume"].stdout
    assert_same_weights(final_weights(root / "two"), final_weights(resumed))
    assert metrics(root / "two") == metrics(resumed)


def test_a_stop_asked_by_a_hook_stops_every_replica_at_the_same_update(runs):
    root, _ = runs
    assert hook_calls(root / "hooked")[-1] == ["run_end", 8]
    assert summary(root / "hooked")["stop_reason"] == "step 7 reached"
    assert [(record["epoch"], record["step"]) for record in metrics(root / "hooked")] == [(1, 8)]


def test_early_stopping_stops_every_replica_at_the_same_epoch(runs):
    root, results = runs
    assert results["early"].returncode == 0
    assert summary(root / "early")["stopped_early"] is True
    assert summary(root / "early")["epochs_run"] == 2


def test_a_nan_loss_stops_every_replica(runs):
    root, results = runs
    assert results["nan"].returncode == 1
    # Either the loss itself overflows, or its gradient does first.
    stopped = r"(training loss is (nan|inf)|the gradients are NaN/inf \(training loss \S+\)) at epoch 1, step "
    assert len(re.findall(stopped, results["nan"].stdout)) == 1, "one line, from one worker, says it for all"
    assert not list((root / "nan" / "checkpoints").glob("*.index"))


def test_every_replica_skips_the_nan_update_and_runs_conv_on_short_batches(skipping):
    # The last batch (7 samples) gives each micro-batch 1 or 2 samples, and the last validation
    # batch (1 sample) gives the second replica a repeat to leave out: the Conv2D model must give the
    # same results on them. Sample 5 is NaN: its update is skipped once per epoch.
    records = metrics(skipping / "two")
    assert [record["skipped_updates"] for record in records] == [1, 1, 1]
    assert summary(skipping / "two")["steps"] == 3 * 25
    assert_same_weights(final_weights(skipping / "one"), final_weights(skipping / "two"), atol=1e-5)
    assert_same_metrics(metrics(skipping / "one"), records, rel=1e-4)


@pytest.fixture(scope="module")
def penalized(tmp_path_factory):
    """The model of test_regularizers.py, whose layers add penalties to the loss, on one replica and on
    two, trained together."""
    root = tmp_path_factory.mktemp("penalized")
    sources = sources_with_penalties(root)
    # 25 global batches of 40 and a short one of 7, which two replicas or --grad-accum-steps 2 cut
    # into parts of 3 and 4 samples, and both together into 1, 2, 2 and 2: their penalties must count so.
    flags = ("--epochs", "1", "--global-batch-size", "40")
    started = {
        "one": start_training(root / "one", *flags, "--grad-accum-steps", "2", sources=sources),
        "two": start_training(root / "two", *flags, sources=sources, replicas=2),
        "two_accum": start_training(root / "two_accum", *flags, "--grad-accum-steps", "2", sources=sources, replicas=2),
    }
    for training in started.values():
        finish(training)
    return root


@pytest.mark.parametrize("variant", ["two", "two_accum"])
def test_penalties_train_alike_on_two_replicas(penalized, variant):
    assert_same_weights(final_weights(penalized / "one"), final_weights(penalized / variant), atol=1e-5)
    assert_same_metrics(metrics(penalized / "one"), metrics(penalized / variant), rel=1e-4)


def test_config_rejects_more_cpu_replicas_than_the_machine_can_hold():
    with pytest.raises(ConfigError, match="--cpu-replicas 5000 is far more than this machine's"):
        TrainConfig(cpu_replicas=5000).validate()
