"""Several optimizers in the JAX template: a conditional GAN on scikit-learn's 8x8 digits.

A fresh `data-parallel` render whose user files this module rewrites: optim.py returns two Optax
optimizers by name, step.py yields the discriminator's loss then the generator's, and eval_step gathers
every drawn image for a dataset metric. One device, 2 devices with 2 micro-steps each, and 2 processes
must train alike; the generator's loss must see the discriminator its stage just updated (a loop that
computes both losses on the old weights fails that check); the judge, in no optimizer, must stay as built.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import in_parallel, jax_run, looptpl, run
from sklearn.datasets import load_digits

DATA = '''"""The 8x8 digits as {"image", "label", "noise"} rows; the generator's noise fixed per image."""

import numpy as np
from sklearn.datasets import load_digits

from .kit.config import TrainConfig


def build_datasets(config: TrainConfig) -> tuple:
    digits = load_digits()
    images = (digits.images.reshape(-1, 64) / 8.0 - 1.0).astype(np.float32)
    noise = np.random.default_rng(1234).normal(size=(len(images), config.latent_size)).astype(np.float32)
    rows = {"image": images, "label": digits.target.astype(np.int32), "noise": noise}
    order = np.random.default_rng(0).permutation(len(images))
    train, val, test = order[:1257], order[1257:1527], order[1527:]
    return tuple({name: values[part] for name, values in rows.items()} for part in (train, val, test))
'''

MODEL = '''"""A generator, a discriminator, and a judge that names digits (random, frozen: in no optimizer)."""

import jax
import jax.numpy as jnp
from flax import nnx

from .kit.config import TrainConfig


class Generator(nnx.Module):
    def __init__(self, latent: int, width: int, rngs: nnx.Rngs) -> None:
        self.label = nnx.Embed(10, latent, rngs=rngs)
        self.hidden = nnx.Linear(2 * latent, width, rngs=rngs)
        self.output = nnx.Linear(width, 64, rngs=rngs)

    def __call__(self, noise: jax.Array, label: jax.Array) -> jax.Array:
        inputs = jnp.concatenate([noise, self.label(label)], axis=1)
        return jnp.tanh(self.output(nnx.leaky_relu(self.hidden(inputs), 0.2)))


class Discriminator(nnx.Module):
    def __init__(self, width: int, rngs: nnx.Rngs) -> None:
        self.label = nnx.Embed(10, 64, rngs=rngs)
        self.hidden = nnx.Linear(128, width, rngs=rngs)
        self.output = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, image: jax.Array, label: jax.Array) -> jax.Array:
        inputs = jnp.concatenate([image, self.label(label)], axis=1)
        return self.output(nnx.leaky_relu(self.hidden(inputs), 0.2))[:, 0]


class GAN(nnx.Module):
    def __init__(self, config: TrainConfig, rngs: nnx.Rngs) -> None:
        self.generator = Generator(config.latent_size, config.width, rngs)
        self.discriminator = Discriminator(config.width, rngs)
        self.judge = nnx.Linear(64, 10, rngs=rngs)


def build_model(config: TrainConfig, rngs: nnx.Rngs) -> nnx.Module:
    return GAN(config, rngs)
'''

STEP = '''"""One discriminator update, then one generator update, on every batch."""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from .kit.api import Gather, Mean
from .kit.config import TrainConfig


def scored_as(logits: jax.Array, real: bool) -> jax.Array:
    return optax.sigmoid_binary_cross_entropy(logits, jnp.full_like(logits, float(real)))


def train_step(model: nnx.Module, batch: Any, config: TrainConfig):
    image, label, noise = batch["image"], batch["label"], batch["noise"]
    fake = model.generator(noise, label)
    real_loss = scored_as(model.discriminator(image, label), True)
    fake_loss = scored_as(model.discriminator(fake, label), False)
    yield "discriminator", Mean(jnp.stack([real_loss, fake_loss], axis=1))
    yield "generator", Mean(scored_as(model.discriminator(model.generator(noise, label), label), True))


def eval_step(model: nnx.Module, batch: Any, config: TrainConfig) -> dict:
    drawn = model.generator(batch["noise"], batch["label"])
    named = model.judge(drawn).argmax(axis=-1)
    return {
        "class_accuracy": Mean((named == batch["label"]).astype(jnp.float32)),
        "real_score": Mean(jax.nn.sigmoid(model.discriminator(batch["image"], batch["label"]))),
        "drawn": Gather(drawn),
        "label": Gather(batch["label"]),
    }
'''

METRICS = '''"""The spread of the drawn images, and what evaluation gathered (for the test to check)."""

import numpy as np


def dataset_metrics(means: dict[str, float], gathered: dict[str, np.ndarray]) -> dict[str, float]:
    drawn, label = gathered["drawn"].astype(np.float64), gathered["label"]
    spread = np.linalg.norm(drawn - drawn.mean(axis=0), axis=1).mean()
    return {"spread": spread, "rows": len(label), "label_order": float((label * np.arange(len(label))).sum())}
'''

OPTIM = '''"""One Adam per network, named as the model's parts; the discriminator's rate scaled by a setting."""

import optax

from .kit.config import TrainConfig


def build_optimizer(config: TrainConfig, total_steps: int) -> dict:
    return {
        "discriminator": optax.adam(config.lr * config.discriminator_lr_scale, b1=0.5),
        "generator": optax.adam(config.lr, b1=0.5),
    }
'''

SETTINGS = '''"""The GAN's sizes, and the discriminator's rate."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Settings:
    latent_size: int = field(default=8, metadata={"help": "Noise size."})
    width: int = field(default=64, metadata={"help": "Hidden width."})
    discriminator_lr_scale: float = field(default=1.0, metadata={"help": "The discriminator's lr, times --lr."})


DEFAULTS: dict[str, Any] = {"monitor": "val_class_accuracy", "monitor_mode": "max"}
TEST_DEFAULTS: dict[str, Any] = {}
'''

# Run in the project with a checkpoint's folder: the parts of the saved state, and how far the judge and the
# generator moved from the weights model.py draws.
CHANGED = """
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from gan.kit.config import parse_config
from gan.model import build_model

built = nnx.state(build_model(parse_config([]), nnx.Rngs(0)))
folder, reader = (Path(sys.argv[1]) / "state").absolute(), ocp.PyTreeCheckpointer()
as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), reader.metadata(folder).item_metadata.tree)
saved = reader.restore(folder, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
print(sorted(saved["params"]), sorted(saved["rest"]))
judge = saved["rest"]["judge"]["kernel"]["value"]
generator = saved["params"]["generator"]["generator"]["output"]["kernel"]["value"]  # the part, then its path
print(np.abs(judge - built["judge"]["kernel"][...]).max())
print(np.abs(generator - built["generator"]["output"]["kernel"][...]).max())
"""

FLAGS = ("--epochs", "2", "--global-batch-size", "64", "--eval-batch-size", "128", "--lr", "0.002", "--no-progress")
NAMES = ("train_discriminator_loss", "train_generator_loss", "val_class_accuracy", "val_real_score", "val_spread")


def render(destination: Path) -> Path:
    created = looptpl(
        "new", str(destination), "--backend", "jax", "--strategy", "data-parallel", "--defaults", "--no-git"
    )
    assert created.exit_code == 0, created.stderr
    package = destination / "src" / destination.name
    files = {"data.py": DATA, "model.py": MODEL, "step.py": STEP, "metrics.py": METRICS, "optim.py": OPTIM}
    for name, text in (files | {"settings.py": SETTINGS}).items():
        (package / name).write_text(text)
    return destination


def train(project: Path, run_dir: Path, *flags: str, processes: int = 0) -> list[dict]:
    """A run's epoch records; `processes` of them started by kit/launch.py, one device each."""
    return jax_run(project, run_dir, *FLAGS, *flags, processes=processes)


def first_step(run_dir: Path) -> dict:
    """The first record of a run's steps.jsonl."""
    return json.loads((run_dir / "steps.jsonl").read_text().splitlines()[0])


def test_two_optimizers_train_alike_on_devices_processes_and_micro_steps(tmp_path):
    gan = render(tmp_path / "gan")
    runs = {
        "one": ("--cpu-devices", "1"),
        "two": ("--cpu-devices", "2", "--grad-accum-steps", "2"),
        "frozen": ("--cpu-devices", "1", "--max-steps", "1", "--log-every", "1", "--discriminator-lr-scale", "0"),
        "moving": ("--cpu-devices", "1", "--max-steps", "1", "--log-every", "1"),
    }
    one, two, _, _ = in_parallel(
        *(lambda flags=flags, name=name: train(gan, tmp_path / name, *flags) for name, flags in runs.items())
    )
    processes = train(gan, tmp_path / "processes", "--cpu-devices", "1", processes=2)
    for other in (two, processes):
        for first, second in zip(one, other, strict=True):
            for name in NAMES:
                assert second[name] == pytest.approx(first[name], rel=1e-5), name
    assert one[-1]["train_generator_loss"] != one[0]["train_generator_loss"]

    # Every validation image drawn and gathered once, in the split's order, from every device and process.
    labels = load_digits().target[np.random.default_rng(0).permutation(1797)[1257:1527]]
    for records_of_a_run in (one, two, processes):
        assert records_of_a_run[-1]["val_rows"] == 270
        assert records_of_a_run[-1]["val_label_order"] == float((labels * np.arange(270)).sum())

    # The generator's first loss is taken on the discriminator its stage just updated: the same batch and
    # weights give the same discriminator loss, and a different generator loss once the discriminator moves.
    frozen, moving = first_step(tmp_path / "frozen"), first_step(tmp_path / "moving")
    assert moving["train_discriminator_loss"] == pytest.approx(frozen["train_discriminator_loss"], rel=1e-6)
    assert abs(moving["train_generator_loss"] - frozen["train_generator_loss"]) > 1e-4

    # The judge, in no optimizer, is saved as model.py drew it; the generator moved.
    last = max((tmp_path / "one" / "checkpoints").iterdir(), key=lambda path: int(path.name))
    done = run(
        [sys.executable, "-c", CHANGED, str(last)],
        cwd=gan,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(gan / "src")},
    )
    assert done.returncode == 0, done.stdout[-3000:]
    parts, judge_moved, generator_moved = done.stdout.strip().splitlines()[-3:]
    assert parts == "['discriminator', 'generator'] ['judge']"
    assert float(judge_moved) == 0.0 and float(generator_moved) > 1e-3


# A user's mistakes with several optimizers, and the one line each gets: (file, its text, the line).
SWAPPED = STEP.replace('yield "discriminator"', 'yield "DISC"').replace('yield "generator"', 'yield "discriminator"')
MISTAKES = {
    "out-of-order": (
        "step.py",
        SWAPPED.replace('yield "DISC"', 'yield "generator"'),
        "train_step's yield number 1 gave 'generator'; yield 'discriminator', Mean() (optim.py's order: "
        "discriminator, generator)",
    ),
    "unknown-part": (
        "optim.py",
        OPTIM.replace('"generator": optax', '"critic": optax'),
        "optim.py has an optimizer 'critic' but model.py's model has no part 'critic' with weights",
    ),
    "returns-a-loss": (
        "step.py",
        STEP.replace('    yield "generator", Mean(', "    return Mean(").replace('yield "discriminator", ', "x = "),
        "optim.py builds 2 optimizers (discriminator, generator): train_step must yield one `name, Mean(...)`",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_mistake_with_several_optimizers_is_one_line(tmp_path, mistake):
    gan = render(tmp_path / "gan")
    file, text, line = MISTAKES[mistake]
    (gan / "src" / "gan" / file).write_text(text)
    command = [sys.executable, "-m", "gan.train", "--run-dir", str(tmp_path / "run"), *FLAGS]
    done = run(command, cwd=gan, timeout=300, env={**os.environ, "PYTHONPATH": str(gan / "src")})
    assert done.returncode != 0
    assert "Traceback" not in done.stdout
    assert line in done.stdout, done.stdout[-2000:]
