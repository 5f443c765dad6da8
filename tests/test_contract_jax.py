"""The user contract of the JAX template holds for a token-weighted objective: lines of text of 2 to 48
bytes, padded to 48, whose loss is the mean over the real tokens of the whole global batch.

A fresh `fsdp` render (the weights sharded, the batches too) whose user files this module rewrites
into a byte-level language model. One device, 2 devices with 2 micro-steps each, and 2 processes with
2 micro-steps each must train alike; the naive variant, each micro-batch averaged over its own tokens
(the bug of transformers#34242), must fail the same check.
"""

import inspect
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import in_parallel, jax_run, looptpl, run

DATA = '''"""Lines of Python's own source as bytes, padded to one length: (tokens, mask) per sample."""

import inspect
import sys
import textwrap

import numpy as np

from .kit.config import TrainConfig

LENGTH = 48  # bytes a line keeps; shorter lines are padded with zeros, their mask 0


def build_datasets(config: TrainConfig) -> tuple:
    lines = [line.strip().encode()[:LENGTH] for line in inspect.getsource(textwrap).splitlines()]
    lines = [line for line in lines if len(line) >= 2]  # some 2 bytes long, many 48: token counts differ a lot
    tokens = np.zeros((len(lines), LENGTH), np.int32)
    mask = np.zeros((len(lines), LENGTH), np.float32)
    for row, line in enumerate(lines):
        tokens[row, : len(line)] = np.frombuffer(line, np.uint8)
        mask[row, : len(line)] = 1
    order = np.random.default_rng(0).permutation(len(lines))
    train, val, test = order[:200], order[200:264], order[264:328]
    return (tokens[train], mask[train]), (tokens[val], mask[val]), (tokens[test], mask[test])
'''

MODEL = '''"""A byte-level model: each byte predicts the next through an embedding and one hidden layer."""

import jax
from flax import nnx

from .kit.config import TrainConfig


class Bytes(nnx.Module):
    def __init__(self, width: int, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(256, width, rngs=rngs)
        self.hidden = nnx.Linear(width, width, rngs=rngs)
        self.output = nnx.Linear(width, 256, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.output(nnx.relu(self.hidden(self.embed(tokens))))


def build_model(config: TrainConfig, rngs: nnx.Rngs) -> nnx.Module:
    return Bytes(config.hidden_size, rngs)
'''

STEP = '''"""The mean loss over the real tokens: each token's loss weighted by its mask."""

from typing import Any

import jax
import optax
from flax import nnx

from .kit.api import Mean, evaluation
from .kit.config import TrainConfig


def token_losses(model: nnx.Module, batch: Any) -> tuple[jax.Array, jax.Array]:
    tokens, mask = batch
    losses = optax.softmax_cross_entropy_with_integer_labels(model(tokens[:, :-1]), tokens[:, 1:])
    return losses, mask[:, 1:]


def train_step(model: nnx.Module, batch: Any, config: TrainConfig) -> Mean:
    losses, mask = token_losses(model, batch)
    return Mean(losses, weights=mask, per="token")


def eval_step(model: nnx.Module, batch: Any, config: TrainConfig) -> dict[str, Mean]:
    losses, mask = token_losses(model, batch)
    return evaluation(loss=Mean(losses, weights=mask, per="token"), metrics={})
'''

# Each micro-batch averaged over its own real tokens, that mean given to every sample of it.
NAIVE = (
    '    return Mean(losses, weights=mask, per="token")\n\n\ndef eval_step',
    "    return Mean(jnp.full(losses.shape[:1], (losses * mask).sum() / mask.sum()))\n\n\ndef eval_step",
)

FLAGS = ("--epochs", "2", "--global-batch-size", "32", "--eval-batch-size", "64", "--hidden-size", "32")
FLAGS += ("--lr", "0.05", "--no-progress")
RUNS = {"one": ("--cpu-devices", "1"), "two": ("--cpu-devices", "2", "--grad-accum-steps", "2")}


def render(destination: Path, step: str) -> Path:
    """An fsdp project whose data, model and step are the byte-level language model's."""
    created = looptpl("new", str(destination), "--backend", "jax", "--strategy", "fsdp", "--defaults", "--no-git")
    assert created.exit_code == 0, created.stderr
    package = destination / "src" / destination.name
    for name, text in {"data.py": DATA, "model.py": MODEL, "step.py": step}.items():
        (package / name).write_text(text)
    return destination


def train(project: Path, run_dir: Path, *flags: str, processes: int = 0) -> list[dict]:
    """A run's epoch records; `processes` of them started by kit/launch.py, one device each."""
    return jax_run(project, run_dir, *FLAGS, *flags, processes=processes)


def one_and_two(project: Path, root: Path) -> list[list[dict]]:
    """The records of the runs on one device and on 2 devices with 2 micro-steps each, side by side."""
    return in_parallel(
        *(lambda flags=flags, name=name: train(project, root / name, *flags) for name, flags in RUNS.items())
    )


def assert_alike(one: list[dict], other: list[dict], rel: float) -> None:
    for first, second in zip(one, other, strict=True):
        for name in ("train_loss", "val_loss"):
            assert second[name] == pytest.approx(first[name], rel=rel), name


def test_token_weighted_loss_is_exact_over_devices_processes_and_micro_steps(tmp_path):
    project = render(tmp_path / "lm", STEP)
    one, two = one_and_two(project, tmp_path)
    processes = train(project, tmp_path / "processes", "--cpu-devices", "1", "--grad-accum-steps", "2", processes=2)
    assert_alike(one, two, rel=1e-5)
    assert_alike(one, processes, rel=1e-5)
    assert one[-1]["val_loss"] < 0.8 * one[0]["train_loss"]  # it learns
    # Every real token of the validation lines once (a line's first byte predicts nothing), no padding.
    lines = [line.strip().encode()[:48] for line in inspect.getsource(textwrap).splitlines()]
    lines = [line for line in lines if len(line) >= 2]  # as DATA builds them
    tokens = sum(len(lines[row]) - 1 for row in np.random.default_rng(0).permutation(len(lines))[200:264])
    assert one[-1]["val_tokens"] == two[-1]["val_tokens"] == processes[-1]["val_tokens"] == tokens


def test_a_mean_of_micro_batch_means_fails_the_same_check(tmp_path):
    naive = STEP.replace(*NAIVE).replace("import jax\n", "import jax\nimport jax.numpy as jnp\n")
    one, two = one_and_two(render(tmp_path / "naive", naive), tmp_path)
    with pytest.raises(AssertionError):
        assert_alike(one, two, rel=1e-5)  # off by 1e-4 to 1e-3


# A mistake in hooks.py, and the one line it gets: (the method replaced, its new body, the line).
HOOK_MISTAKES = {
    "raises": ("on_epoch_start", "1 / 0", "hooks.py:{line} failed in Hooks.on_epoch_start: ZeroDivisionError"),
    "not-a-number": ("on_log", 'return {"note": "text"}', "hooks.py: on_log must return numbers, got 'note': str"),
    "not-json": ("state_dict", "return {1j: 0}", "hooks.py: state_dict must return JSON-serializable values"),
}


@pytest.mark.parametrize("mistake", HOOK_MISTAKES)
def test_a_mistake_in_hooks_is_one_line_naming_it(tmp_path, mistake):
    created = looptpl("new", str(tmp_path / "hooked"), "--backend", "jax", "--strategy", "single", "--defaults")
    assert created.exit_code == 0, created.stderr
    method, body, message = HOOK_MISTAKES[mistake]
    hooks = tmp_path / "hooked" / "src" / "hooked" / "hooks.py"
    text = hooks.read_text()
    header = next(line for line in text.splitlines() if line.startswith(f"    def {method}("))
    hooks.write_text(text.replace(header, f"{header}\n        {body}"))
    line = text.splitlines().index(header) + 2
    command = [sys.executable, "-m", "hooked.train", "--run-dir", str(tmp_path / "run"), "--epochs", "1"]
    done = run(command, cwd=tmp_path / "hooked", timeout=300, env={"PYTHONPATH": str(tmp_path / "hooked" / "src")})
    output = done.stdout.strip().splitlines()  # its output and errors, together
    assert done.returncode == 1 and "Traceback" not in done.stdout, done.stdout[-3000:]
    assert output[-1].startswith("error: ") and message.format(line=line) in output[-1], output[-5:]
