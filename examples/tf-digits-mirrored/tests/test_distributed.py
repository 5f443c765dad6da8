"""Two replicas (logical CPU devices) train exactly like one replica with the same global batch."""

import pytest
from conftest import (
    TRAIN_FLAGS,
    assert_same_metrics,
    assert_same_weights,
    final_weights,
    finish,
    metrics,
    run_training,
    start_training,
    summary,
)

VAL_SAMPLES, TEST_SAMPLES = 270, 270  # data.py's split sizes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two-replica runs, started together; the resumed one continues once its first part is done."""
    root = tmp_path_factory.mktemp("runs")
    started = {
        "two": start_training(root / "two", *TRAIN_FLAGS, replicas=2),
        "two_accum": start_training(root / "two_accum", *TRAIN_FLAGS, "--grad-accum-steps", "2", replicas=2),
        "resumed": start_training(root / "resumed", *TRAIN_FLAGS, "--stop-after-epoch", "1", replicas=2),
        # With a zero learning rate the validation loss never improves after the first epoch.
        "early": start_training(root / "early", "--epochs", "6", "--lr", "0", "--early-stop-patience", "1", replicas=2),
        "nan": start_training(root / "nan", "--epochs", "2", "--lr", "1e30", "--max-grad-norm", "0", replicas=2),
    }
    results = {name: finish(training, expect_success=name != "nan") for name, training in started.items()}
    run_training(root / "resumed", *TRAIN_FLAGS, "--resume", replicas=2)
    return root, results


@pytest.mark.parametrize("variant", ["two", "two_accum"])
def test_two_replicas_match_one(reference, runs, variant):
    # The short last batch (17 samples) is split unevenly over replicas and micro-steps, one replica getting none:
    # it must still give the same update as on one replica.
    root, _ = runs
    assert_same_weights(final_weights(reference), final_weights(root / variant), atol=1e-5)
    assert_same_metrics(metrics(reference), metrics(root / variant), rel=1e-4)


def test_evaluation_counts_every_sample_once(reference, runs):
    root, _ = runs
    for record in metrics(root / "two"):
        assert record["val_samples"] == VAL_SAMPLES
    result = summary(root / "two")
    assert result["test_samples"] == TEST_SAMPLES
    for name in ["test_loss", "test_accuracy"]:
        assert result[name] == pytest.approx(summary(reference)[name], rel=1e-5)


def test_resume_on_two_replicas_matches_an_uninterrupted_run(runs):
    root, _ = runs
    assert_same_weights(final_weights(root / "two"), final_weights(root / "resumed"))
    assert metrics(root / "two") == metrics(root / "resumed")


def test_early_stopping_stops_every_replica_at_the_same_epoch(runs):
    root, results = runs
    assert results["early"].returncode == 0
    assert summary(root / "early")["stopped_early"] is True
    assert summary(root / "early")["epochs_run"] == 2


def test_a_nan_loss_stops_every_replica(runs):
    root, results = runs
    assert results["nan"].returncode == 1
    assert "training loss is nan at epoch 1, step " in results["nan"].stdout
    assert not list((root / "nan" / "checkpoints").glob("*.index"))
