"""Training and evaluation on a JAX stream (data.py returns an iterable of samples without a length).

The stream's consecutive samples make the global batches, pass after pass; every process reads the
whole stream and loads its own rows. One device, 2 devices with 2 micro-steps each and 2 processes must
train alike (dropout included: a sample's mask comes from its pass and place); a run stopped in the
middle of its second pass and resumed must equal the uninterrupted one; a streamed split must evaluate
to what the same samples give as arrays; and a stream the loop cannot train is refused in one line.
"""

import json
import sys
from pathlib import Path

import pytest
from conftest import edit, in_parallel, jax_run, looptpl, run

MADE = "make_split(1003), make_split(251), make_split(257)"  # data.py's train, val and test splits

# The synthetic task's samples one at a time, without a length, as a reader of files yields them.
STREAM = '''

class Stream:
    """A split's samples, one (inputs, target) pair at a time; pass n in an order of its own."""

    def __init__(self, arrays, drop_last=0):
        self.arrays, self.epoch, self.drop_last = arrays, 0, drop_last

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = np.random.default_rng(self.epoch).permutation(len(self.arrays[1]))
        for row in order[: len(order) - self.drop_last]:
            yield tuple(array[row] for array in self.arrays)
'''

# 1003 samples, 64 a global batch: 15 full ones and a short one of 43 make a pass of 16 updates; 40
# updates are 2.5 passes.
FLAGS = ("--max-steps", "40", "--global-batch-size", "64", "--log-every", "5", "--no-progress")


def streamed_project(destination: Path, returned: str) -> Path:
    """A data-parallel project whose build_datasets returns `returned` of the train, val and test arrays."""
    created = looptpl("new", str(destination), "--backend", "jax", "--strategy", "data-parallel", "--defaults")
    assert created.exit_code == 0, created.stderr
    edit(destination, "data.py", f"    return {MADE}\n", f"    train, val, test = {MADE}\n    {returned}\n")
    data = next((destination / "src").glob("*/data.py"))
    data.write_text(data.read_text() + STREAM)
    return destination


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose three splits are streams."""
    return streamed_project(
        tmp_path_factory.mktemp("jax_streamed") / "streamed", "return Stream(train), Stream(val), Stream(test)"
    )


def train(project: Path, run_dir: Path, *flags: str, processes: int = 0) -> list[dict]:
    return jax_run(project, run_dir, *FLAGS, *flags, processes=processes)


def validations(run_dir: Path) -> list[tuple]:
    """Each validation inside the epoch (--eval-every): its update, and the training and validation loss."""
    logged = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    return [(record["step"], record["train_loss"], record["val_loss"]) for record in logged if "val_loss" in record]


def assert_alike(one: list[dict], other: list[dict], rel: float) -> None:
    for first, second in zip(one, other, strict=True):
        for name in ("train_loss", "val_loss", "val_accuracy"):
            assert second[name] == pytest.approx(first[name], rel=rel), name


def test_a_stream_trains_alike_on_devices_processes_and_micro_steps_and_resumes_exactly(streamed, tmp_path):
    every = ("--checkpoint-every", "10", "--eval-every", "20")
    one, two, straight, _ = in_parallel(
        lambda: train(streamed, tmp_path / "one", "--cpu-devices", "1"),
        lambda: train(streamed, tmp_path / "two", "--cpu-devices", "2", "--grad-accum-steps", "2"),
        lambda: train(streamed, tmp_path / "straight", "--cpu-devices", "1", *every),
        lambda: train(streamed, tmp_path / "resumed", "--cpu-devices", "1", *every, "--stop-after-step", "23"),
    )
    processes = train(streamed, tmp_path / "processes", "--cpu-devices", "1", processes=2)
    assert [record["step"] for record in one] == [40]  # one epoch of 40 updates, 2.5 passes
    assert one[0]["val_samples"] == 251
    assert_alike(one, two, rel=1e-5)
    assert_alike(one, processes, rel=1e-5)
    # Stopped in the middle of the second pass (update 7 of it) and resumed: the same run, to the bit.
    resumed = train(streamed, tmp_path / "resumed", "--cpu-devices", "1", *every, "--resume")
    assert resumed == straight
    assert validations(tmp_path / "resumed") == validations(tmp_path / "straight")  # at update 20, in the first run


def test_a_streamed_split_evaluates_every_sample_once_as_its_arrays_do(tmp_path):
    flags = ("--epochs", "1", "--eval-batch-size", "16", "--cpu-devices", "2")
    arrays = streamed_project(tmp_path / "arrays", "return train, val, test")
    evaluated = streamed_project(tmp_path / "evaluated", "return train, Stream(val), Stream(test)")
    sized, unknown = in_parallel(
        lambda: jax_run(arrays, tmp_path / "sized", *flags), lambda: jax_run(evaluated, tmp_path / "unknown", *flags)
    )
    assert unknown[0]["val_samples"] == 251
    for name in ("train_loss", "val_loss", "val_accuracy"):
        assert unknown[0][name] == pytest.approx(sized[0][name], rel=1e-6), name
    summaries = [(tmp_path / run / "summary.json").read_text() for run in ("sized", "unknown")]
    assert '"test_samples": 257' in summaries[0] and '"test_samples": 257' in summaries[1]


# A stream the loop cannot train, and the one line each gets: (what build_datasets returns, flags, the line,
# the exit status: 2 for a flag, 1 for data).
REFUSED = {
    "no-max-steps": (
        "return Stream(train), val, test",
        ("--epochs", "1"),
        "data.py's train set is a stream (an iterable without a length): train it for --max-steps updates",
        2,
    ),
    "steps-per-epoch": (
        "return Stream(train), val, test",
        ("--max-steps", "4", "--steps-per-epoch", "2"),
        "--steps-per-epoch: data.py's train set is a stream, whose epoch is --max-steps updates",
        2,
    ),
    "an-iterator": (
        "return iter(Stream(train)), val, test",
        ("--max-steps", "4"),
        "data.py: the train split is an iterator, which can be read once; return an object whose __iter__",
        1,
    ),
}


@pytest.mark.parametrize("mistake", REFUSED)
def test_a_stream_the_loop_cannot_train_is_refused_in_one_line(tmp_path, mistake):
    returned, flags, line, code = REFUSED[mistake]
    project = streamed_project(tmp_path / "refused", returned)
    command = [sys.executable, "-m", "refused.train", "--run-dir", str(tmp_path / "run"), *flags]
    done = run(command, cwd=project, timeout=300, env={"PYTHONPATH": str(project / "src")})
    output = done.stdout.strip().splitlines()
    assert done.returncode == code and "Traceback" not in done.stdout, done.stdout[-3000:]
    assert output[-1].startswith("error: ") and line in output[-1], output[-5:]


def test_streams_of_different_lengths_on_the_processes_stop_the_run_in_one_line(tmp_path):
    # Process 1's stream is 50 samples shorter: a pass of 15 updates, not 16; it would train on other batches.
    returned = "return Stream(train, drop_last=50 * jax.process_index()), val, test"
    project = streamed_project(tmp_path / "uneven", returned)
    edit(project, "data.py", "import numpy as np\n", "import jax\nimport numpy as np\n")
    command = [sys.executable, "-m", "uneven.kit.launch", "--processes", "2", "--", "--run-dir", str(tmp_path / "run")]
    command += [*FLAGS, "--cpu-devices", "1"]
    done = run(command, cwd=project, timeout=300, env={"PYTHONPATH": str(project / "src")})
    assert done.returncode != 0 and "Traceback" not in done.stdout, done.stdout[-3000:]
    assert (
        "error: data.py: the processes' train streams have passes of different lengths (seen at update 20)"
        in done.stdout
    )
    assert not (tmp_path / "run" / "summary.json").exists()
