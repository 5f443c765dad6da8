"""hooks.py: its methods run in order, add values to the logs, see the weights of the moment, keep their
state over a resume, and end the run."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from test_training import epoch_ends, records, saved_state, train

RECORDING_HOOKS = """import json
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

STOP_AT_STEP = 0


class Hooks:
    def __init__(self, config):
        self.config = config
        self.logs = 0

    def record(self, run, *event):
        with (Path(self.config.run_dir) / f"hooks-rank{run.rank}.jsonl").open("a") as file:
            file.write(json.dumps(event) + "\\n")

    def on_run_start(self, run):
        self.record(run, "run_start", run.epoch, run.step)

    def on_epoch_start(self, run, epoch):
        self.record(run, "epoch_start", epoch)

    def after_update(self, run):
        self.record(run, "update", run.step)
        if run.step == STOP_AT_STEP:
            run.request_stop(f"step {STOP_AT_STEP} reached")

    def on_log(self, run, record):
        self.logs += 1
        self.record(run, "log", record["step"])
        return {"logs_counted": self.logs}

    def after_evaluation(self, run, split, results):
        self.record(run, "evaluation", split)
        name = self.config.monitor.removeprefix("val_")  # val_loss, unless settings.py names another
        return {f"{split}_{name}_doubled": 2 * results[f"{split}_{name}"]}

    def on_epoch_end(self, run, record):
        weights = jax.tree.leaves(nnx.state(run.model(), nnx.Param))
        self.record(run, "epoch_end", record["epoch"], float(sum(jnp.abs(weight).sum() for weight in weights)))

    def on_run_end(self, run, summary):
        self.record(run, "run_end", summary["steps"])

    def state_dict(self):
        return {"logs": self.logs}

    def load_state_dict(self, state):
        self.logs = state["logs"]
"""


def sources_with_recording_hooks(directory: Path, stop_at: int = 0) -> dict[str, str]:
    """The environment of a run whose hooks.py records each call to hooks-rank<R>.jsonl in the run directory,
    counts the logged records (a count kept in the checkpoints), adds values to the logs, and asks to end the
    run once update `stop_at` is done."""
    sources = directory / "src"
    shutil.copytree(Path(__file__).resolve().parents[1] / "src", sources, ignore=shutil.ignore_patterns("__pycache__"))
    hooks = RECORDING_HOOKS.replace("STOP_AT_STEP = 0", f"STOP_AT_STEP = {stop_at}")
    (sources / "charlm_dp" / "hooks.py").write_text(hooks)
    return {"PYTHONPATH": str(sources)}  # the copy, not the project's own src/


def hook_calls(run_dir: Path) -> list[list]:
    return [json.loads(line) for line in (run_dir / "hooks-rank0.jsonl").read_text().splitlines()]


def step_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def hooked_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs with hooks that record their calls: straight, stopped part-way and resumed, and ended by a hook
    asking after update 3 (with --log-every 4: the run ends after update 4)."""
    root = tmp_path_factory.mktemp("hooked_runs")
    recording = sources_with_recording_hooks(root / "recording")
    stopping = sources_with_recording_hooks(root / "stopping", stop_at=3)
    flags = ("--log-every", "5", "--checkpoint-every", "5")
    runs = [
        ("straight", *flags),
        ("resumed", *flags, "--stop-after-step", "5"),
        ("resumed", *flags, "--resume"),
    ]
    for name, *run_flags in runs:
        done = train(root / name, *run_flags, env=recording)
        assert done.returncode == 0, done.stderr[-3000:]
    done = train(root / "stopped", "--log-every", "4", env=stopping)
    assert done.returncode == 0, done.stderr[-3000:]
    (root / "stopped" / "output.txt").write_text(done.stdout)
    return root


def test_hooks_run_in_order_add_values_and_see_the_weights_of_the_moment(hooked_runs: Path) -> None:
    run_dir = hooked_runs / "straight"
    calls, ends = hook_calls(run_dir), epoch_ends(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    expected: list[list] = [["run_start", 0, 0]]
    for epoch, (start, end) in enumerate(zip([0, *ends], ends, strict=False), 1):
        # A record every 5 updates of the epoch, at its end, and before each checkpoint (every 5 of the run).
        logged = [step for step in range(start + 1, end + 1) if (step - start) % 5 == 0 or step % 5 == 0 or step == end]
        expected += [["epoch_start", epoch], *[["log", step] for step in logged]]
        expected += [["evaluation", "val"], ["epoch_end", epoch]]
    if "tested_checkpoint" in summary:  # no final test where data.py builds no test set
        expected.append(["evaluation", "test"])
    expected.append(["run_end", ends[-1]])
    assert [call[:3] if call[0] != "epoch_end" else call[:2] for call in calls if call[0] != "update"] == expected
    assert [call[1] for call in calls if call[0] == "update"] == list(range(1, ends[-1] + 1))
    monitor = json.loads((run_dir / "config.json").read_text())["monitor"]
    for record in records(run_dir):
        assert record[f"{monitor}_doubled"] == 2 * record[monitor]
    logged = step_records(run_dir)
    assert [record["logs_counted"] for record in logged] == list(range(1, len(logged) + 1))
    # run.model() holds the weights the epoch ended with: those of its checkpoint, not the first ones.
    sums = [call[2] for call in calls if call[0] == "epoch_end"]
    saved = saved_state(run_dir / "checkpoints" / str(ends[-1]))["params"]
    assert sums[-1] == pytest.approx(sum(float(np.abs(weight).sum()) for weight in jax.tree.leaves(saved)), rel=1e-5)
    assert sums[0] != sums[-1]


def test_hook_state_survives_a_resume(hooked_runs: Path) -> None:
    def counted(run_dir: Path) -> list[tuple[int, int]]:
        return [(record["step"], record["logs_counted"]) for record in step_records(run_dir)]

    assert counted(hooked_runs / "resumed") == counted(hooked_runs / "straight")


def test_a_hook_ends_the_run_at_the_next_log_boundary(hooked_runs: Path) -> None:
    run_dir = hooked_runs / "stopped"
    end = min(4, epoch_ends(hooked_runs / "straight")[0])  # or the first epoch's end, if it comes first
    assert [(record["epoch"], record["step"]) for record in records(run_dir)] == [(1, end)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["steps"], summary["stopped_early"], summary["stop_reason"]) == (end, True, "step 3 reached")
    assert "stopping: step 3 reached" in (run_dir / "output.txt").read_text()
