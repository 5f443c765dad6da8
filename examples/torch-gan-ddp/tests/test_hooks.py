"""hooks.py: its methods run in order, add values, keep their state over a resume, stop the run."""

import json

import pytest
from conftest import (
    edited_sources,
    finish,
    hook_calls,
    metrics,
    run_training,
    sources_with_recording_hooks,
    start_training,
    step_records,
    summary,
)
from project import epoch_of, final_split, project_settings

FLAGS = ("--epochs", "2", "--log-every", "5", "--checkpoint-every", "5")


@pytest.fixture(scope="module")
def hooked_runs(tmp_path_factory):
    """Runs with hooks that record their calls, started together: straight, stopped part-way
    through epoch 2 (then resumed), and stopped by a hook."""
    root = tmp_path_factory.mktemp("hooked_runs")
    recording = sources_with_recording_hooks(root / "recording")
    stopping = sources_with_recording_hooks(root / "stopping", stop_at=7)
    flags = (*FLAGS, *epoch_of(16))
    straight = start_training(root / "straight", *flags, sources=recording)
    stopped = start_training(root / "stopped", "--epochs", "3", "--log-every", "4", *epoch_of(16), sources=stopping)
    # Stopped after update 23, then resumed, while the others go on.
    run_training(root / "resumed", *flags, "--stop-after-step", "23", sources=recording)
    run_training(root / "resumed", *flags, "--resume", sources=recording)
    finish(straight)
    finish(stopped)
    return root


def test_hooks_run_in_order_add_values_and_keep_their_state_over_a_resume(hooked_runs):
    per_epoch = 16  # epoch_of(16)
    expected = [["run_start", 0, 0]]
    for epoch in (1, 2):
        expected.append(["epoch_start", epoch])
        for done in range(1, per_epoch + 1):
            expected.append(["update", (epoch - 1) * per_epoch + done])
            if done % 5 == 0 or done == per_epoch:
                expected.append(["log", (epoch - 1) * per_epoch + done])
        expected += [["evaluation", "val"], ["epoch_end", epoch]]
    if final_split() == "test":  # no final test where data.py builds no test set
        expected.append(["evaluation", "test"])
    assert hook_calls(hooked_runs / "straight") == [*expected, ["run_end", 2 * per_epoch]]
    # on_epoch_end comes before the epoch is logged and checkpointed, as hooks.py says: [epoch, logged, checkpointed].
    seen = (hooked_runs / "straight" / "on-epoch-end.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in seen] == [[1, 0, False], [2, 1, False]]
    monitor = project_settings().monitor  # the hooks double it: val_loss, unless settings.py names another
    for record in metrics(hooked_runs / "straight"):
        assert record[f"{monitor}_doubled"] == 2 * record[monitor]
    final, name = summary(hooked_runs / "straight"), f"{final_split()}_{monitor.removeprefix('val_')}"
    assert final[f"{name}_doubled"] == 2 * final[name]
    steps = step_records(hooked_runs / "straight")
    assert [record["updates_counted"] for record in steps] == [record["step"] for record in steps]
    # Stopped part-way through epoch 2 and resumed: the hooks' count continues from the checkpoint.
    assert step_records(hooked_runs / "resumed") == steps


def test_a_hook_ends_the_run_at_the_next_log_boundary(hooked_runs):
    # Asked at update 7, with --log-every 4: epoch 1 ends after update 8, is validated and
    # checkpointed, and the run tests its best checkpoint as after early stopping.
    run_dir = hooked_runs / "stopped"
    assert [(record["epoch"], record["step"]) for record in metrics(run_dir)] == [(1, 8)]
    result = summary(run_dir)
    assert (result["steps"], result["stopped_early"], result["stop_reason"]) == (8, True, "step 7 reached")
    assert hook_calls(run_dir)[-1] == ["run_end", 8]


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        # A value under a name the results already hold, and a value the logs cannot hold.
        ("{'val_samples': 0}", "hooks.py: after_evaluation must return a dict of new names, got ['val_samples']"),
        ("{'note': 'ok'}", "hooks.py: after_evaluation must return numbers, got 'note': str; return float(...) of it"),
    ],
)
def test_a_mistake_in_a_hook_is_one_line(tmp_path, returned, message):
    last_return = "        return {}\n\n    def on_epoch_end"
    sources = edited_sources(tmp_path, "hooks.py", last_return, last_return.replace("{}", returned))
    result = run_training(tmp_path / "run", "--epochs", "1", sources=sources, expect_success=False)
    assert result.returncode == 1
    assert message in result.stdout
    assert "Traceback" not in result.stdout
