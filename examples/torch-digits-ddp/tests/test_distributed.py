"""Two ranks train exactly like one rank with the same global batch (gloo on the CPU).

The tests start the ranks themselves, each with the variables torchrun gives it (conftest.py's
`rank_variables`), forked from a process that imported torch once; the tests of what torchrun itself
does (restarts, stopping the other ranks, its summary of a failure) run under torchrun.
"""

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    PROJECT_ROOT,
    RUN_TIMEOUT_S,
    ZERO_LR,
    assert_same_metrics,
    assert_same_weights,
    damage,
    edited_sources,
    final_average,
    final_weights,
    finish,
    hook_calls,
    metrics,
    run_training,
    sources_recomputing_the_whole_model,
    sources_with_a_nan_training_sample,
    sources_with_dropout,
    sources_with_recording_hooks,
    start,
    start_training,
    summary,
    torchrun,
    training_command,
)
from forked_runs import free_port
from project import epoch_of, evaluated_samples, final_split, final_test, resumed_message, updates_per_epoch

from digits_ddp.kit.checkpoint import checkpoints_in

# --train-in-eval-mode: dropout (and batch norm) would draw differently on 1 and 2 ranks, so the runs
# compared here train with those layers as in evaluation; every gradient and update is still exercised.
# The moving average of the weights (--ema-decay) is compared too: its val_ema_* metrics and, on resume, itself.
EPOCHS = ["--epochs", "3", "--train-in-eval-mode", "--ema-decay", "0.9"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same training on 1 rank, on 2 ranks, and on 2 ranks with 2 accumulation steps; and the
    runs of the tests below that need no edited sources. All start together."""
    root = tmp_path_factory.mktemp("runs")
    hooked = sources_with_recording_hooks(root / "hooked_src", stop_at=7)
    started = {
        "one": start_training(root / "one", *EPOCHS),
        "two": start_training(root / "two", *EPOCHS, ranks=2),
        "two_accum": start_training(root / "two_accum", *EPOCHS, "--grad-accum-steps", "2", ranks=2),
        # Rank 1 alone asks to stop at update 7; with --log-every 4 both ranks end epoch 1 after update 8.
        "hooked": start_training(root / "hooked", "--epochs", "3", "--log-every", "4", ranks=2, sources=hooked),
        "two_then_one": start_training(root / "two_then_one", *EPOCHS, "--stop-after-epoch", "1", ranks=2),
        # Stopped after epoch 2, then resumed on 2 ranks once a bit of its newest checkpoint flipped on disk.
        "damaged": start_training(root / "damaged", *EPOCHS, "--stop-after-epoch", "2", ranks=2),
        "early": start_training(root / "early", "--epochs", "6", *ZERO_LR, "--early-stop-patience", "1", ranks=2),
        # Under torchrun, whose summary of the failure the test reads.
        "nan": start_training(
            root / "nan", "--epochs", "2", "--lr", "1e30", "--max-grad-norm", "0", launcher=torchrun(2)
        ),
    }
    # "two_then_one" ends first, and is resumed on 1 rank while the others go on.
    results = {"two_then_one": finish(started.pop("two_then_one"))}
    resumed = {"resume_on_one": start_training(root / "two_then_one", *EPOCHS, "--resume")}
    results["damaged"] = finish(started.pop("damaged"))
    damage(checkpoints_in(root / "damaged" / "checkpoints")[-1])
    resumed["damaged_resume"] = start_training(root / "damaged", *EPOCHS, "--resume", ranks=2)
    results |= {name: finish(training, expect_success=name != "nan") for name, training in started.items()}
    results |= {name: finish(training) for name, training in resumed.items()}
    return root, results


@pytest.mark.parametrize("variant", ["two", "two_accum"])
def test_two_ranks_match_one_rank(runs, variant):
    # The train set (1003 samples) does not divide by the global batch (64): the short last
    # batch is split over ranks and micro-steps and must still give the same update.
    root, _ = runs
    assert_same_weights(final_weights(root / "one"), final_weights(root / variant), rtol=1e-5)
    assert_same_weights(final_average(root / "one"), final_average(root / variant), rtol=1e-5)
    assert_same_metrics(metrics(root / "one"), metrics(root / variant), rel=1e-4)


def test_evaluation_counts_every_sample_once(runs):
    root, _ = runs
    # With the template's data the split is odd (251), so one rank evaluates a padded sample.
    for record in metrics(root / "two"):
        assert record["val_samples"] == evaluated_samples("val")
    split = final_split()  # "test", or "val" where data.py builds no test set
    assert final_test(root / "two")[f"{split}_samples"] == evaluated_samples(split)
    assert final_test(root / "two") == pytest.approx(final_test(root / "one"), rel=1e-5)


def test_resume_part_way_through_an_epoch_on_two_ranks_matches_an_uninterrupted_run(tmp_path):
    # With dropout and 2 accumulation steps: 16 updates an epoch, stopped after update 23 (with
    # checkpoints every 5), resumed from there; each rank's dropout draws continue where they were.
    # The resumed run writes its checkpoints in the background while it trains (--async-checkpoints),
    # and runs the whole model, dropout included, again in each backward pass (--activation-checkpointing).
    sources = sources_recomputing_the_whole_model(tmp_path / "recomputed", sources_with_dropout(tmp_path / "dropout"))
    flags = ("--epochs", "3", "--grad-accum-steps", "2", "--checkpoint-every", "5", "--ema-decay", "0.9", *epoch_of(16))
    straight = start_training(tmp_path / "straight", *flags, ranks=2, sources=sources)  # meanwhile, to compare with
    background = (*flags, "--async-checkpoints", "--activation-checkpointing")
    run_training(tmp_path / "resumed", *background, "--stop-after-step", "23", ranks=2, sources=sources)
    result = run_training(tmp_path / "resumed", *background, "--resume", ranks=2, sources=sources)
    finish(straight)
    assert resumed_message(23, per_epoch=16) in result.stdout
    assert not list((tmp_path / "resumed").rglob("*.tmp"))
    assert_same_weights(final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed"))
    assert_same_weights(final_average(tmp_path / "straight"), final_average(tmp_path / "resumed"))
    assert metrics(tmp_path / "straight") == metrics(tmp_path / "resumed")


def test_a_damaged_newest_checkpoint_is_skipped_kept_aside_and_written_again(runs):
    # "damaged" stopped after epoch 2 of 3; then one bit of its newest checkpoint flipped, which still loads.
    # Its checksum refuses it, both ranks resume from epoch 1 and write epoch 2 again, and the run ends
    # like an uninterrupted one.
    root, results = runs
    output = results["damaged_resume"].stdout
    newest = root / "damaged" / "checkpoints" / "epoch-0002.pt"
    assert f"warning: skipping unreadable checkpoint {newest} (" in output and "is damaged" in output
    assert resumed_message(updates_per_epoch()) in output and "Traceback" not in output
    assert [path.name for path in (newest.parent / "damaged").iterdir()] == [newest.name]
    assert_same_weights(final_weights(root / "two"), final_weights(root / "damaged"))
    assert metrics(root / "two") == metrics(root / "damaged")


def test_hooks_run_alike_on_every_rank_and_a_stop_asked_on_one_rank_stops_all(runs):
    # Rank 1 alone asks to stop at update 7; with --log-every 4 both ranks end epoch 1 after update 8.
    root, _ = runs
    run_dir = root / "hooked"
    assert hook_calls(run_dir, rank=0) == hook_calls(run_dir, rank=1)
    assert hook_calls(run_dir, rank=0)[-1] == ["run_end", 8]
    assert summary(run_dir)["stop_reason"] == "a hook asked, on another rank"
    assert [(record["epoch"], record["step"]) for record in metrics(run_dir)] == [(1, 8)]


def test_resume_on_a_different_number_of_ranks(runs):
    # Checkpoints hold full, unsharded states: a 2-rank run (stopped after epoch 1) can continue on 1 rank.
    root, results = runs
    assert "written by 2 ranks" in results["resume_on_one"].stdout
    assert_same_weights(final_weights(root / "two"), final_weights(root / "two_then_one"), rtol=1e-5)
    assert_same_weights(final_average(root / "two"), final_average(root / "two_then_one"), rtol=1e-5)


def test_early_stopping_stops_every_rank_at_the_same_epoch(runs):
    root, results = runs
    assert results["early"].returncode == 0
    assert summary(root / "early")["stopped_early"] is True
    assert summary(root / "early")["epochs_run"] == 2


def test_a_nan_loss_stops_every_rank(runs):
    _, results = runs
    result = results["nan"]
    assert result.returncode != 0
    # Said once, by rank 0 (not glued to the same line from every rank), and quoted by torchrun's summary.
    [line] = [line for line in result.stdout.splitlines() if line.startswith("error: training loss is")]
    assert "error_file: <N/A>" not in result.stdout and f"traceback : {line}" in result.stdout


def test_nan_policy_skip_drops_the_same_update_as_one_rank(tmp_path):
    # One NaN training input makes one update's gradients NaN; every rank must skip that same update.
    sources = sources_with_a_nan_training_sample(tmp_path)
    flags = ("--epochs", "1", "--nan-policy", "skip", "--train-in-eval-mode")
    started = [
        start_training(tmp_path / "one", *flags, sources=sources),
        start_training(tmp_path / "two", *flags, ranks=2, sources=sources),
    ]
    for training in started:
        finish(training)
    assert metrics(tmp_path / "two")[0]["skipped_updates"] == 1
    assert summary(tmp_path / "two")["steps"] == summary(tmp_path / "one")["steps"]
    assert_same_weights(final_weights(tmp_path / "one"), final_weights(tmp_path / "two"), rtol=1e-5)


def fault_in_rank_1(tmp_path, at_item: int, fault: str):
    """Sources whose training data runs `fault` in rank 1 at its `at_item`-th sample, on the first attempt only."""
    wrapper = f"""

class _FaultyDataset(torch.utils.data.Dataset):
    def __init__(self, inner):
        self.inner, self.items = inner, 0

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        self.items += 1
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if self.items == {at_item} and os.environ.get("RANK") == "1" and first_attempt:
            {fault}
        return self.inner[index]


_build_datasets = build_datasets


def build_datasets(config):
    train_set, val_set, test_set = _build_datasets(config)
    return _FaultyDataset(train_set), val_set, test_set
"""
    marker = "    return make_split(1003), make_split(251), make_split(257)\n"
    sources = edited_sources(tmp_path, "data.py", marker, marker + wrapper)
    data_file = sources / "digits_ddp" / "data.py"
    data_file.write_text("import os\nimport signal\nimport time\n" + data_file.read_text())
    return sources


def test_a_killed_worker_restarts_and_ends_like_an_uninterrupted_run(runs, tmp_path):
    # Rank 1 dies by SIGKILL in update 10 of epoch 3 (its 1300th sample; 16 updates per epoch);
    # torchrun restarts both ranks, which resume from the checkpoint written after update 40.
    root, _ = runs
    sources = fault_in_rank_1(tmp_path, 1300, "os.kill(os.getpid(), signal.SIGKILL)")
    restarting = (*torchrun(2), "--max-restarts", "1")
    result = run_training(tmp_path / "run", *EPOCHS, "--checkpoint-every", "5", sources=sources, launcher=restarting)
    assert resumed_message(40) in result.stdout
    assert_same_weights(final_weights(root / "two"), final_weights(tmp_path / "run"))
    assert metrics(root / "two") == metrics(tmp_path / "run")


def test_a_hung_rank_makes_the_others_fail_within_the_timeout(tmp_path):
    # Rank 1 hangs but dies of SIGTERM: once rank 0 has failed, torchrun stops the other ranks with
    # SIGTERM, and gives one that outlives it (the loop's handler only notes it) 30 s before SIGKILL.
    sources = fault_in_rank_1(tmp_path, 300, "signal.signal(signal.SIGTERM, signal.SIG_DFL); time.sleep(600)")
    result = run_training(
        tmp_path / "run", *EPOCHS, "--dist-timeout-s", "5", sources=sources, launcher=torchrun(2), expect_success=False
    )
    assert result.returncode != 0
    assert "a collective timed out" in result.stdout


def test_two_nodes_train_like_one_node(runs, tmp_path):
    # Two torchrun agents, one rank each, meet through the c10d rendezvous as two machines would.
    rendezvous = ("--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=test")
    agent = (sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", *rendezvous)
    command = training_command(tmp_path / "run", *EPOCHS, launcher=agent)
    nodes = [start(command, tmp_path / f"node{index}.log") for index in range(2)]
    for node in nodes:
        finish(node)
    root, _ = runs
    assert_same_weights(final_weights(root / "two"), final_weights(tmp_path / "run"))


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, from /proc (Linux)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    found = [int(child) for child in children.read_text().split()] if children.exists() else []
    return [grandchild for child in found for grandchild in [child, *descendants(child)]]


def test_the_slurm_script_starts_torchrun_on_every_node_and_a_sigterm_ends_the_job_with_143(tmp_path):
    # Stand-ins for Slurm's commands: srun runs the command once, as on a one-node allocation.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = 'echo $$ > "$TASK_PID_FILE"; exec "$@"'  # the task keeps srun's process id
    for name, body in {"srun": srun, "scontrol": "echo localhost"}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(stat.S_IRWXU)
    script = PROJECT_ROOT / "scripts" / "slurm.sbatch"
    run_dir = tmp_path / "run"
    environment = {
        "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "1",
        "SLURM_JOB_NAME": "test",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "GPUS_PER_NODE": "2",
        "RDZV_PORT": str(free_port()),
        "RUN_DIR": str(run_dir),
        "TASK_PID_FILE": str(tmp_path / "task.pid"),
    }
    flags = ["--device", "cpu", "--no-progress", "--epochs", "2", "--log-every", "1"]
    job = start(["bash", str(script), *flags], tmp_path / "job.log", **environment)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (run_dir / "steps.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # Slurm's --signal: SIGTERM to every process of the job step (the task, torchrun, the ranks).
    task = int((tmp_path / "task.pid").read_text())
    for pid in [task, *descendants(task)]:
        os.kill(pid, signal.SIGTERM)
    stopped = finish(job, expect_success=False)
    assert stopped.returncode == 143, stopped.stdout[-3000:]
    assert "stopped by SIGTERM after update" in stopped.stdout
    # Run again, as a requeued job would: it resumes instead of refusing the existing run.
    environment["RDZV_PORT"] = str(free_port())
    result = finish(start(["bash", str(script), *flags], tmp_path / "requeued.log", **environment))
    assert "resumed after update" in result.stdout
    assert summary(run_dir)["epochs_run"] == 2
