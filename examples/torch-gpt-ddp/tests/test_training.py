"""The loop trains, logs, resumes exactly, and stops cleanly on early stopping and NaN.

A run is mostly start-up on one core, so runs that do not depend on each other start together:
most in the `runs` fixture, which the tests then check one by one.
"""

import importlib.util
import itertools
import json
import math
import os
import re
import subprocess
import sys

import pytest
from conftest import (
    CONSTANT_LR,
    PROJECT_ROOT,
    ZERO_LR,
    assert_same_metrics,
    assert_same_weights,
    damage,
    final_weights,
    finish,
    metrics,
    run_training,
    sources_with_a_nan_training_sample,
    sources_with_dropout,
    start,
    start_training,
    step_records,
    summary,
    training_command,
)
from project import (
    epoch_of,
    evaluated_samples,
    final_split,
    final_test,
    losses,
    monitored_improved,
    project_settings,
    resumed_message,
    samples_per_epoch,
    updates_per_epoch,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs of the template's project, started together; three of them stop early and are resumed."""
    root = tmp_path_factory.mktemp("runs")
    diverging = ("--epochs", "2", "--lr", "1e30", "--max-grad-norm", "0")
    skipping = ("--nan-policy", "skip", "--max-consecutive-skips", "3")
    # The train set does not divide by 64, so the short last batch is split over micro-steps too.
    # --train-in-eval-mode: dropout would draw different masks for differently split batches.
    max_steps = str(updates_per_epoch() + 4)
    cosine = ("--schedule", "cosine", "--warmup-steps", "5", "--min-lr", "1e-4")
    big_batch = ("--epochs", "2", "--global-batch-size", "64", "--train-in-eval-mode")
    started = {
        "reference": start_training(root / "reference", "--epochs", "3"),
        "bf16": start_training(root / "bf16", "--epochs", "2", "--precision", "bf16", "--profile"),
        "fp16": start_training(root / "fp16", "--epochs", "2", "--precision", "fp16"),
        "one_batch": start_training(root / "one_batch", *big_batch),
        "accum": start_training(root / "accum", *big_batch, "--grad-accum-steps", "4"),
        # Ends 4 updates into epoch 2.
        "max_steps": start_training(root / "max_steps", "--max-steps", max_steps, *cosine),
        # With a zero learning rate the validation loss never improves after the first epoch.
        "early": start_training(root / "early", "--epochs", "6", *ZERO_LR, "--early-stop-patience", "2"),
        "nan": start_training(root / "nan", *diverging),
        "diverged": start_training(root / "diverged", *diverging, *skipping),
        "bad_split": start_training(root / "bad_split", "--global-batch-size", "63", "--grad-accum-steps", "2"),
        # Like "reference" up to its stop; resumed below once its newest checkpoint is damaged.
        "crashed": start_training(root / "crashed", "--epochs", "3", "--stop-after-epoch", "2"),
        # Both stop after epoch 1, to be resumed with a changed setting below.
        "changed_lr": start_training(root / "changed_lr", "--epochs", "2", "--stop-after-epoch", "1"),
        "changed_model": start_training(root / "changed_model", "--epochs", "2", "--stop-after-epoch", "1"),
    }
    # The same command twice, with a folder per run: started together, they claim a folder each.
    each = root / "each" / "{start}"
    for name in ("each_first", "each_second"):
        started[name] = start(training_command(each, "--epochs", "1"), root / f"{name}.log")
    # The stopped runs end first, and are resumed while the others go on.
    stopped = ("crashed", "changed_lr", "changed_model", "each_first", "each_second")
    results = {name: finish(started.pop(name)) for name in stopped}
    damage(root / "crashed" / "checkpoints" / "epoch-0002.pt")  # one bit flipped: it still loads
    changed_lr = ("--lr", str(2 * project_settings().lr))
    resumed = {
        "crashed_resume": start_training(root / "crashed", "--epochs", "3", "--resume"),
        "lr_refused": start_training(root / "changed_lr", "--epochs", "2", "--resume", *changed_lr),
        # A setting of settings.py that changes the network's shape.
        "model_refused": start_training(root / "changed_model", "--epochs", "2", "--resume", "--hidden-size", "32"),
        "each_resumed": start(training_command(each, "--epochs", "1", "--resume"), root / "each_resumed.log"),
        "none_to_resume": start_training(root / "none" / "{start}", "--epochs", "1", "--resume"),
    }
    failing = {"nan", "diverged", "bad_split", "lr_refused", "model_refused", "none_to_resume"}
    started |= resumed
    results |= {name: finish(training, expect_success=name not in failing) for name, training in started.items()}
    return root, results


def test_profile_records_updates_4_to_6(runs):
    root, results = runs
    assert f"profile of 3 updates written to {root / 'bf16' / 'profile'}" in results["bf16"].stdout
    [trace] = (root / "bf16" / "profile").glob("rank0.*.pt.trace.json")
    events = [event.get("name", "") for event in json.loads(trace.read_text())["traceEvents"]]
    # Steps are counted from 0: updates 4 to 6, each with the step of every optimizer inside.
    steps = sorted({name for name in events if name.startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    optimizers = [name for name in metrics(root / "bf16")[0] if name.startswith("train_") and name.endswith("_loss")]
    assert sum(name.startswith("Optimizer.step") for name in events) == 3 * len(optimizers)


def test_trains_and_writes_the_run_directory(runs):
    root, _ = runs
    records = metrics(root / "reference")
    assert [record["epoch"] for record in records] == [1, 2, 3]
    assert monitored_improved(records)
    assert all(math.isfinite(record[name]) for record in records for name in losses(record))
    for name in ["config.json", "metrics.csv", "checkpoints/epoch-0003.pt", "checkpoints/best.pt"]:
        assert (root / "reference" / name).is_file(), name
    result = summary(root / "reference")
    assert result["epochs_run"] == 3
    split = final_split()  # "test", or "val" where data.py builds no test set
    assert final_test(root / "reference")[f"{split}_samples"] == evaluated_samples(split)
    assert all(math.isfinite(value) for value in final_test(root / "reference").values())
    # The training speed leaves validation and the test out: their time is eval_time_s (rounded to 10 ms, so a
    # fast evaluation of a small split reads 0.0).
    assert result["eval_time_s"] >= 0
    trained = 3 * samples_per_epoch()
    # Both figures are rounded (train_time_s to 10 ms, which is much of a run on a fast GPU): the speed
    # lies between what the ends of that rounding give.
    seconds, speed = result["train_time_s"], result["train_samples_per_s"]
    assert trained / (seconds + 0.005) - 0.05 <= speed <= trained / max(seconds - 0.005, 1e-9) + 0.05


def test_plot_writes_curves_or_explains_what_is_missing(runs):
    root, _ = runs
    run_dir = root / "reference"
    command = [sys.executable, "-m", "gpt_ddp.kit.plot", str(run_dir)]
    environment = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if importlib.util.find_spec("matplotlib") is None:
        assert result.returncode == 1 and "needs matplotlib" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        logged = metrics(run_dir)[0]
        others = [name for name in logged if name.startswith("val_") and name not in [*losses(logged), "val_samples"]]
        panels = ["loss", *(name.removeprefix("val_") for name in others)]  # "loss": every loss, on one panel
        for name in panels:
            assert (run_dir / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG"), name


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(runs, precision):
    root, _ = runs
    records = metrics(root / precision)
    assert monitored_improved(records)
    assert all(math.isfinite(record[name]) for record in records for name in losses(record))


def test_gradient_accumulation_matches_one_big_batch(runs):
    # "accum" splits each global batch of 64, and the short last one, over 4 micro-steps.
    root, _ = runs
    assert_same_weights(final_weights(root / "one_batch"), final_weights(root / "accum"), rtol=1e-5)
    assert_same_metrics(metrics(root / "one_batch"), metrics(root / "accum"), rel=1e-4)


def test_max_steps_ends_part_way_through_an_epoch(runs):
    root, _ = runs
    records = metrics(root / "max_steps")
    per_epoch = updates_per_epoch()
    assert [(record["epoch"], record["step"]) for record in records] == [(1, per_epoch), (2, per_epoch + 4)]
    # The cosine schedule ran over the --max-steps updates, not 2 whole epochs, down to --min-lr.
    assert records[-1]["lr"] == pytest.approx(1e-4, rel=1e-6)


def test_the_schedule_warms_up_then_decays_to_min_lr_and_an_optim_py_that_drops_it_is_refused():
    from gpt_ddp.kit.config import TrainConfig
    from gpt_ddp.kit.errors import DataError
    from gpt_ddp.kit.schedules import check_floor, warmup_schedule
    from gpt_ddp.model import build_model
    from gpt_ddp.optim import build_optimizer, build_scheduler

    # optim.py's schedule over 10 updates, on model.py's network(s): the first optimizer's, with several.
    config = TrainConfig(lr=1e-3, warmup_steps=2, min_lr=1e-4)
    optimizers = build_optimizer(build_model(config), config)
    schedules = build_scheduler(optimizers, config, 10)
    optimizer, schedule = (
        next(iter(built.values())) if isinstance(built, dict) else built for built in (optimizers, schedules)
    )
    peak = optimizer.param_groups[0]["initial_lr"]  # --lr, unless optim.py sets its own
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[:3] == pytest.approx([peak / 2, peak, peak])  # warmup, then the peak
    assert all(later < earlier for earlier, later in itertools.pairwise(rates[2:]))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)  # after the last update: the floor
    check_floor(schedule, config.min_lr)
    # An optim.py written before --min-lr existed builds the schedule without it: refused, not ignored.
    with pytest.raises(DataError, match=r"ends at min_lr=0.0, but --min-lr is 0.0001: pass min_lr=config.min_lr"):
        check_floor(warmup_schedule(optimizer, "cosine", 2, 10), config.min_lr)


def test_eval_every_validates_part_way_and_leaves_training_alone(tmp_path):
    # 16 updates per epoch: validations at updates 6, 12, 18, 24 and 30 (the epoch ends validate
    # anyway), and a record of the training loss every 4 updates of an epoch besides.
    sources = sources_with_dropout(tmp_path)
    flags = ("--epochs", "2", *CONSTANT_LR, "--log-every", "4", *epoch_of(16))
    # These three go on while the run below is stopped part-way and resumed.
    plain = start_training(tmp_path / "plain", *flags, sources=sources)
    validated = start_training(tmp_path / "validated", *flags, "--eval-every", "6", sources=sources)
    six = start_training(tmp_path / "six", *flags, "--max-steps", "6", sources=sources)
    stopped = (*flags, "--eval-every", "6", "--checkpoint-every", "5")
    run_training(tmp_path / "resumed", *stopped, "--stop-after-step", "13", sources=sources)
    run_training(tmp_path / "resumed", *stopped, "--resume", sources=sources)
    for training in (plain, validated, six):
        finish(training)
    steps = step_records(tmp_path / "validated")
    # On the CPU too, each record gives the speed of the updates since the one before.
    logged = [json.loads(line) for line in (tmp_path / "validated" / "steps.jsonl").read_text().splitlines()]
    assert all(record["update_time_ms"] > 0 and record["samples_per_s"] > 0 for record in logged)
    assert [record["step"] for record in steps] == [4, 6, 8, 12, 16, 18, 20, 24, 28, 30, 32]
    assert [record["step"] for record in steps if "val_loss" in record] == [6, 12, 18, 24, 30]
    # Validating part-way changes nothing in training (train mode restored, no random draws taken).
    assert_same_weights(final_weights(tmp_path / "plain"), final_weights(tmp_path / "validated"))
    assert metrics(tmp_path / "plain") == metrics(tmp_path / "validated")
    # The validation at update 6 is that of the weights after 6 updates: a run of 6 updates ends there.
    at_six = next(record for record in steps if record["step"] == 6)
    assert at_six["val_loss"] == metrics(tmp_path / "six")[-1]["val_loss"]
    # Stopped and resumed part-way, the run logs each record once, the same as the uninterrupted run.
    assert step_records(tmp_path / "resumed") == steps
    assert_same_weights(final_weights(tmp_path / "plain"), final_weights(tmp_path / "resumed"))


def test_early_stopping_ends_the_run(runs):
    root, _ = runs
    result = summary(root / "early")
    assert result["stopped_early"] is True
    assert result["epochs_run"] == 3


def test_a_nan_loss_stops_the_run_with_a_message(runs):
    root, results = runs
    result = results["nan"]
    assert result.returncode == 1
    assert "training loss is nan" in result.stdout or "training loss is inf" in result.stdout
    assert not list((root / "nan" / "checkpoints").glob("*.pt"))


def test_nan_policy_skip_drops_only_the_bad_updates(tmp_path):
    sources = sources_with_a_nan_training_sample(tmp_path)
    skipping = start_training(tmp_path / "run", "--epochs", "2", "--nan-policy", "skip", sources=sources)
    stopping = start_training(tmp_path / "stopped", "--epochs", "2", sources=sources)
    finish(skipping)
    records = metrics(tmp_path / "run")
    assert [record["skipped_updates"] for record in records] == [1, 1]
    assert all(math.isfinite(record["train_loss"]) and math.isfinite(record["val_loss"]) for record in records)
    assert summary(tmp_path / "run")["steps"] == 2 * (updates_per_epoch() - 1)

    stopped = finish(stopping, expect_success=False)
    assert stopped.returncode == 1
    assert "training loss is nan" in stopped.stdout


def test_nan_policy_skip_still_stops_a_diverged_run(runs):
    root, results = runs
    result = results["diverged"]
    assert result.returncode == 1
    assert "NaN/inf for 4 updates in a row" in result.stdout
    assert not list((root / "diverged" / "checkpoints").glob("*.pt"))


def test_bad_batch_split_is_refused(runs):
    _, results = runs
    result = results["bad_split"]
    assert result.returncode != 0
    assert "--global-batch-size 63 must be divisible" in result.stdout


def test_a_finished_run_is_not_overwritten(runs):
    root, _ = runs
    before = final_weights(root / "reference")
    result = run_training(root / "reference", "--epochs", "3", expect_success=False)
    assert result.returncode == 2 and "--resume" in result.stdout
    assert_same_weights(before, final_weights(root / "reference"))


def test_each_run_gets_a_folder_of_its_own_and_resume_continues_the_newest(runs):
    root, results = runs
    # runs/2026-11-26_09-30-00, then a later second's, or the same second's with -2: newest last.
    runs_made = [path for path in (root / "each").iterdir() if path.is_dir() and not path.is_symlink()]
    folders = sorted(runs_made, key=lambda folder: (folder.name[:19], len(folder.name), folder.name))
    assert (root / "each" / "latest").is_symlink() and (root / "each" / "latest").resolve() in folders
    named = [folder for folder in folders for name in ("each_first", "each_second") if named_by(results[name], folder)]
    assert len(folders) == 2 and sorted(named) == sorted(folders), results["each_second"].stdout
    older = next(results[name].stdout for name in ("each_first", "each_second") if named_by(results[name], folders[0]))
    assert f"plot         python -m gpt_ddp.kit.plot {folders[0]}\n" in older
    for key, value in summary(folders[0]).items():  # numbers rounded on screen, whole in summary.json
        shown = str(value) if not isinstance(value, float) else f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
        assert re.search(rf"^{key} +{re.escape(shown)}$", older, re.M), key
    # The newest, finished, is tested again: it trains nothing, so it gives no training speed.
    assert "train_samples_per_s" not in results["each_resumed"].stdout
    assert named_by(results["each_resumed"], folders[-1])
    assert results["none_to_resume"].returncode == 2
    assert "--resume: no folder matching --run-dir" in results["none_to_resume"].stdout


def named_by(result, folder) -> bool:
    """Whether a run's closing lines name this folder as its run folder."""
    return f"run folder   {folder}  (took " in result.stdout


def test_a_corrupt_newest_checkpoint_is_skipped_on_resume(runs):
    # "crashed" stopped after epoch 2 of 3; then one bit of epoch-0002.pt flipped on disk before its resume.
    # Its checksum refuses it (it is kept in checkpoints/damaged/), and the run goes on from epoch 1.
    root, results = runs
    result = results["crashed_resume"]
    assert "skipping unreadable checkpoint" in result.stdout and "is damaged" in result.stdout
    assert resumed_message(updates_per_epoch()) in result.stdout
    assert (root / "crashed" / "checkpoints" / "damaged" / "epoch-0002.pt").is_file()
    assert_same_weights(final_weights(root / "reference"), final_weights(root / "crashed"))


def test_resuming_with_a_changed_learning_rate_is_refused(runs):
    _, results = runs
    result = results["lr_refused"]
    assert result.returncode == 2
    used = project_settings().lr  # the refused run asked for twice that
    assert f"cannot resume with a changed --lr {2 * used} (the run used {used})" in result.stdout


def test_resuming_with_a_different_model_is_refused(runs):
    if not hasattr(project_settings(), "hidden_size"):
        pytest.skip("settings.py no longer has hidden_size, the setting this test changes")
    _, results = runs
    result = results["model_refused"]
    assert result.returncode == 1
    assert "does not fit the model and optimizer built by model.py" in result.stdout
