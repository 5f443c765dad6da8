"""A resumed run ends exactly like an uninterrupted one: from an epoch end, from part-way through an
epoch (with random augmentation, dropout and DataLoader workers) and after a SIGTERM."""

import signal
import time

from conftest import (
    assert_same_weights,
    final_average,
    final_weights,
    finish,
    metrics,
    run_training,
    sources_recomputing_the_whole_model,
    sources_with_dropout,
    sources_with_random_augmentation,
    start_training,
    summary,
)
from project import final_test, resumed_message, updates_per_epoch


def test_resume_gives_the_same_result_as_an_uninterrupted_run(tmp_path):
    straight = start_training(tmp_path / "straight", "--epochs", "4")  # meanwhile, the run to compare with
    run_training(tmp_path / "resumed", "--epochs", "4", "--stop-after-epoch", "2")
    assert not (tmp_path / "resumed" / "summary.json").exists()
    run_training(tmp_path / "resumed", "--epochs", "4", "--resume")
    finish(straight)
    assert_same_weights(final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed"))
    assert metrics(tmp_path / "straight") == metrics(tmp_path / "resumed")
    assert final_test(tmp_path / "straight") == final_test(tmp_path / "resumed")


def test_a_run_stopped_mid_epoch_resumes_exactly_with_augmentation_dropout_and_workers(tmp_path):
    # Random augmentation in data.py: the resumed run loads with 2 DataLoader workers, the
    # uninterrupted one in the main process. Each sample's draws depend on the seed, the epoch and
    # its index only, and dropout's on the generator state the checkpoint holds, so both runs end
    # with the same weights, to the bit.
    # The moving average of the weights (--ema-decay) resumes with them. The resumed run also runs
    # the whole model, dropout included, again in each backward pass (--activation-checkpointing):
    # that must not change a bit either.
    sources = sources_with_dropout(tmp_path / "dropout", sources_with_random_augmentation(tmp_path))
    sources = sources_recomputing_the_whole_model(tmp_path / "recomputed", sources)
    flags = ("--epochs", "3", "--checkpoint-every", "10", "--ema-decay", "0.9")
    straight = start_training(tmp_path / "straight", *flags, sources=sources)  # meanwhile, the run to compare with
    workers = ("--num-workers", "2", "--activation-checkpointing")
    stopped = run_training(tmp_path / "resumed", *flags, *workers, "--stop-after-step", "23", sources=sources)
    assert "stopped after update 23, checkpointed; continue with --resume" in stopped.stdout
    written = sorted(path.name for path in (tmp_path / "resumed" / "checkpoints").iterdir())
    # Part-way through epoch 2 (16 updates per epoch): after update 20 and at the stop; the newest two are kept.
    assert written == ["best.pt", "epoch-0002-step-00000020.pt", "epoch-0002-step-00000023.pt"]
    run_training(tmp_path / "resumed", *flags, *workers, "--resume", sources=sources)
    finish(straight)
    assert_same_weights(final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed"))
    assert_same_weights(final_average(tmp_path / "straight"), final_average(tmp_path / "resumed"))
    assert metrics(tmp_path / "straight") == metrics(tmp_path / "resumed")
    assert {"val_ema_loss", "val_loss"} <= set(metrics(tmp_path / "resumed")[-1])


def test_sigterm_checkpoints_and_the_resumed_run_ends_like_an_uninterrupted_one(tmp_path):
    # What Slurm and Kubernetes send before a kill: the run stops at its next --log-every
    # boundary with a checkpoint, exit status 143, and --resume carries on as if nothing happened.
    flags = ("--epochs", "8", "--log-every", "1")
    straight = start_training(tmp_path / "straight", *flags)  # meanwhile, the run to compare with
    training = start_training(tmp_path / "stopped", *flags)
    deadline = time.monotonic() + 120
    while not (tmp_path / "stopped" / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    training.process.send_signal(signal.SIGTERM)
    result = finish(training, expect_success=False)
    assert result.returncode == 143, result.stdout
    assert "SIGTERM: stopping at the next --log-every boundary, with a checkpoint" in result.stdout
    assert "stopped by SIGTERM after" in result.stdout
    assert not list((tmp_path / "stopped").rglob("*.tmp"))
    run_training(tmp_path / "stopped", *flags, "--resume")
    finish(straight)
    assert_same_weights(final_weights(tmp_path / "straight"), final_weights(tmp_path / "stopped"))
    assert metrics(tmp_path / "straight") == metrics(tmp_path / "stopped")


def test_a_run_goes_on_from_the_updates_it_has_done_whatever_flags_led_there(tmp_path):
    # A run's place is the number of updates it has done, whether it got there by --max-steps, --epochs,
    # --stop-after-step or --checkpoint-every. A constant learning rate does not depend on the run's length,
    # so a run extended several times ends exactly like one run straight to its end.
    per_epoch, constant = updates_per_epoch(), ("--schedule", "constant")
    straight = start_training(tmp_path / "straight", "--epochs", "3", *constant)  # meanwhile, to compare with
    chain = tmp_path / "chain"
    run_training(chain, "--max-steps", "4", *constant)  # ends part-way through epoch 1: validated and tested
    refused = run_training(chain, "--max-steps", "3", "--resume", *constant, expect_success=False)
    assert refused.returncode == 2 and "has done 4 updates, more than --max-steps 3 asks for" in refused.stdout
    longer = ("--epochs", "3", "--checkpoint-every", "3", *constant)  # --epochs after --max-steps
    stopped = run_training(chain, *longer, "--stop-after-step", str(per_epoch + 2), "--resume")
    assert resumed_message(4) in stopped.stdout
    assert f"stopped after update {per_epoch + 2}, checkpointed" in stopped.stdout
    finished = run_training(chain, *longer, "--resume")
    assert resumed_message(per_epoch + 2) in finished.stdout
    finish(straight)
    assert summary(chain)["steps"] == summary(tmp_path / "straight")["steps"] == 3 * per_epoch
    assert_same_weights(final_weights(tmp_path / "straight"), final_weights(chain))
    assert metrics(tmp_path / "straight") == metrics(chain)
