"""A resumed run ends exactly like an uninterrupted one: from an epoch end, from part-way through an
epoch (with random augmentation, dropout and DataLoader workers) and after a SIGTERM or a Ctrl-C."""

import signal
import time

import pytest
from conftest import (
    CONSTANT_LR,
    assert_same_weights,
    edited_sources,
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
from project import epoch_of, final_test, resumed_message, updates_per_epoch


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
    flags = ("--epochs", "3", "--checkpoint-every", "10", "--ema-decay", "0.9", *epoch_of(16))
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


def signal_flags() -> tuple[str, ...]:
    return ("--epochs", "8", "--log-every", str(updates_per_epoch() // 2), "--num-workers", "2")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run that both signals' stopped and resumed runs end like (run once, for both)."""
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    run_training(run_dir, *signal_flags())
    return run_dir


@pytest.mark.parametrize(("name", "code"), [("SIGTERM", 143), ("Ctrl-C", 130)])
def test_a_signal_checkpoints_and_the_resumed_run_ends_like_an_uninterrupted_one(tmp_path, uninterrupted, name, code):
    # SIGTERM is what Slurm sends every process of a job before a kill, Ctrl-C what a terminal sends
    # every process of its group: DataLoader workers get it too. Either way the run stops at its next
    # --log-every boundary with a checkpoint, exit status 128 + the signal, and --resume carries on as if
    # nothing happened.
    # The next boundary is updates away: DataLoader workers (forked with the loop's handlers) must
    # leave the Ctrl-C to the loop, keep loading until then, and say nothing.
    flags = signal_flags()
    training = start_training(tmp_path / "stopped", *flags)
    deadline = time.monotonic() + 120
    while not (tmp_path / "stopped" / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    training.signal_all(signal.SIGINT if name == "Ctrl-C" else signal.SIGTERM)
    result = finish(training, expect_success=False)
    assert result.returncode == code, result.stdout
    assert result.stdout.count(f"{name}: stopping at the next --log-every boundary, with a checkpoint") == 1
    assert f"stopped by {name} after" in result.stdout and "Traceback" not in result.stdout
    assert not list((tmp_path / "stopped").rglob("*.tmp"))
    run_training(tmp_path / "stopped", *flags, "--resume")
    assert_same_weights(final_weights(uninterrupted), final_weights(tmp_path / "stopped"))
    assert metrics(uninterrupted) == metrics(tmp_path / "stopped")


def test_a_second_ctrl_c_stops_at_once_in_one_line(tmp_path):
    # Updates slowed by a hook, and no --log-every boundary for seconds: the first Ctrl-C asks for a
    # stop there, the second one (a second later) ends the run now, without a traceback.
    end = '(`.item()` waits for the device every update)."""\n'  # the end of after_update's docstring
    slower = '        time.sleep(0.05)\n        (Path(self.config.run_dir) / "updating").touch()\n'
    sources = edited_sources(tmp_path / "slower", "hooks.py", end, end + slower)
    imports = "from typing import Any\n"
    more_imports = "import time\nfrom pathlib import Path\n" + imports
    sources = edited_sources(tmp_path / "imports", "hooks.py", imports, more_imports, sources)
    # 126 updates an epoch with the template's data, and whole epochs however TEST_DEFAULTS cuts them.
    flags = ("--epochs", "3", "--global-batch-size", "8", "--steps-per-epoch", "0", "--log-every", "100000")
    training = start_training(tmp_path / "run", *flags, sources=sources)
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "updating").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    training.signal_all(signal.SIGINT)
    time.sleep(1.5)
    training.signal_all(signal.SIGINT)
    result = finish(training, expect_success=False)
    assert result.returncode == 130, result.stdout
    assert "Ctrl-C again to stop at once" in result.stdout and "Traceback" not in result.stdout
    last_line = result.stdout.rstrip().splitlines()[-1]
    assert last_line == "error: stopped by Ctrl-C; a run that wrote a checkpoint continues with --resume"


def test_a_run_goes_on_from_the_updates_it_has_done_whatever_flags_led_there(tmp_path):
    # A run's place is the number of updates it has done, whether it got there by --max-steps, --epochs,
    # --stop-after-step or --checkpoint-every. A constant learning rate does not depend on the run's length,
    # so a run extended several times ends exactly like one run straight to its end.
    per_epoch, constant = updates_per_epoch(), CONSTANT_LR
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
