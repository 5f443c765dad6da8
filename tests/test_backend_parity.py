"""The torch, TensorFlow and JAX templates implement the same training semantics.

A torch `single`, a TensorFlow `one-device` and a JAX `single` project get the same linear model, the
same initial weights, the same data in the same order and the same flags; their per-epoch losses must
then agree to float rounding (TensorFlow differs from torch by about 2e-6 relative; the test allows
1e-4, and a 20% change of --weight-decay on one side alone already breaks it, as does JAX seeing its
first epoch's order in every epoch). The flags exercise everything the loops must do alike: a short
last batch (103 = 5 x 20 + 3) averaged over its true size, two accumulation steps (one of them empty
in TensorFlow's last batch), linear warmup then cosine decay, gradient clipping, and AdamW with
decoupled weight decay.

Defaults that differ between the frameworks are settled in the templates, not here: the
TensorFlow template's optim.py passes PyTorch's AdamW epsilon (1e-8; Keras' default is 1e-7), and
the optim.py files pass --weight-decay (Keras' AdamW default is 0.004, PyTorch's 0.01, Optax's 1e-4).
What remains is Keras' AdamW adding epsilon before its bias correction rather than after, a
difference of order epsilon / sqrt(v), far below the tolerance, and JAX's data order, its own
permutation of (seed, epoch): its data.py maps the loop's requests onto torch's order."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import in_parallel, looptpl, run

FEATURES, CLASSES = 8, 3
SIZES = {"train": 103, "val": 37, "test": 29}
FLAGS = [
    *("--epochs", "3", "--global-batch-size", "20", "--grad-accum-steps", "2", "--eval-batch-size", "64"),
    *("--lr", "0.05", "--warmup-steps", "3", "--schedule", "cosine", "--max-grad-norm", "0.5"),
    *("--weight-decay", "0.1", "--seed", "0", "--no-progress"),
]
ENVIRONMENT = {
    "CUDA_VISIBLE_DEVICES": "",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "OMP_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "JAX_PLATFORMS": "cpu",
}

TORCH_DATA = '''"""Parity test: fixed arrays."""

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from .config import TrainConfig

NUM_FEATURES, NUM_CLASSES = {features}, {classes}
ARRAYS = np.load(r"{arrays}")


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset]:
    def split(name: str) -> TensorDataset:
        return TensorDataset(torch.from_numpy(ARRAYS[name + "_x"]), torch.from_numpy(ARRAYS[name + "_y"]).long())

    return split("train"), split("val"), split("test")
'''

TORCH_MODEL = '''"""Parity test: one linear layer with fixed initial weights."""

import numpy as np
import torch
from torch import nn

from .config import TrainConfig
from .data import NUM_CLASSES, NUM_FEATURES

INITIAL = np.load(r"{weights}")


def build_model(config: TrainConfig) -> nn.Module:
    model = nn.Linear(NUM_FEATURES, NUM_CLASSES)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(INITIAL["kernel"].T))
        model.bias.copy_(torch.from_numpy(INITIAL["bias"]))
    return model
'''

TF_DATA = '''"""Parity test: fixed arrays, the train split in the order the torch project's sampler visits it."""

import numpy as np
import tensorflow as tf

from .config import TrainConfig

NUM_FEATURES, NUM_CLASSES = {features}, {classes}
ARRAYS = np.load(r"{arrays}")
EPOCH_ORDERS = iter(np.load(r"{orders}"))  # the engine reads the train set once per epoch, in order


def build_datasets(config: TrainConfig) -> tuple[tf.data.Dataset, tf.data.Dataset, tf.data.Dataset]:
    def in_torch_order():
        for index in next(EPOCH_ORDERS):
            yield ARRAYS["train_x"][index], ARRAYS["train_y"][index]

    signature = (tf.TensorSpec([NUM_FEATURES], tf.float32), tf.TensorSpec([], tf.int32))
    train = tf.data.Dataset.from_generator(in_torch_order, output_signature=signature)
    train = train.apply(tf.data.experimental.assert_cardinality(len(ARRAYS["train_y"])))

    def split(name: str) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices((ARRAYS[name + "_x"], ARRAYS[name + "_y"]))

    return train, split("val"), split("test")


def make_batches(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    return dataset.batch(batch_size)
'''

TF_MODEL = '''"""Parity test: one linear layer with fixed initial weights."""

import keras
import numpy as np

from .config import TrainConfig
from .data import NUM_CLASSES, NUM_FEATURES

INITIAL = np.load(r"{weights}")


def build_model(config: TrainConfig) -> keras.Model:
    layer = keras.layers.Dense(
        NUM_CLASSES,
        kernel_initializer=keras.initializers.Constant(INITIAL["kernel"]),
        bias_initializer=keras.initializers.Constant(INITIAL["bias"]),
    )
    return keras.Sequential([keras.Input(shape=(NUM_FEATURES,)), layer])
'''

JAX_DATA = '''"""Parity test: fixed arrays, the train split in the order the torch project's sampler visits it."""

import numpy as np

from .kit.config import TrainConfig

NUM_FEATURES, NUM_CLASSES = {features}, {classes}
ARRAYS = np.load(r"{arrays}")
EPOCH_ORDERS = np.load(r"{orders}")


class InTorchOrder:
    """The train split as the torch run visits it. The loop asks for the samples of its own order (a
    permutation of (seed 0, epoch)), each batch padded to 20 rows: the n-th request is position n % 120 of
    epoch n // 120 in that order, and gets the sample torch's sampler has at that position."""

    def __init__(self) -> None:
        self.requests = 0
        self.positions = [np.argsort(np.random.default_rng([0, epoch]).permutation(103)) for epoch in range(3)]

    def __len__(self) -> int:
        return 103

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        epoch = self.requests // 120
        self.requests += 1
        chosen = EPOCH_ORDERS[epoch][self.positions[epoch][index]]
        return ARRAYS["train_x"][chosen], ARRAYS["train_y"][chosen]


def build_datasets(config: TrainConfig) -> tuple:
    def split(name: str) -> tuple[np.ndarray, np.ndarray]:
        return ARRAYS[name + "_x"], ARRAYS[name + "_y"]

    return InTorchOrder(), split("val"), split("test")
'''

JAX_MODEL = '''"""Parity test: one linear layer with fixed initial weights."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from .data import NUM_CLASSES, NUM_FEATURES
from .kit.config import TrainConfig

INITIAL = np.load(r"{weights}")


def build_model(config: TrainConfig, rngs: nnx.Rngs) -> nnx.Module:
    layer = nnx.Linear(NUM_FEATURES, NUM_CLASSES, rngs=rngs)
    layer.kernel.value = jnp.asarray(INITIAL["kernel"])
    layer.bias.value = jnp.asarray(INITIAL["bias"])
    return layer
'''

# Prints the sample order of each epoch as the torch project's own sampler yields it.
TORCH_ORDER = """
import json, sys
from {package}.sampling import GlobalBatchSampler
sampler = GlobalBatchSampler({size}, 20, 2, rank=0, world_size=1, seed=0)
orders = []
for epoch in range(3):
    sampler.set_epoch(epoch)
    orders.append([index for micro_batch in sampler for index in micro_batch])
json.dump(orders, sys.stdout)
"""


def render(root: Path, backend: str, strategy: str) -> Path:
    project = root / f"parity_{backend}"
    result = looptpl("new", str(project), "--backend", backend, "--strategy", strategy, "--no-git")
    assert result.exit_code == 0, result.stderr
    return project


def package(project: Path) -> Path:
    return project / "src" / project.name


def train(project: Path, *flags: str) -> list[dict]:
    command = [sys.executable, "-m", f"{project.name}.train", "--run-dir", str(project / "run"), *FLAGS, *flags]
    result = run(command, cwd=project, timeout=300, env={**ENVIRONMENT, "PYTHONPATH": str(project / "src")})
    assert result.returncode == 0, result.stdout[-5000:]
    return [json.loads(line) for line in (project / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow (tensorflow-cpu)")
def test_torch_tensorflow_and_jax_follow_the_same_loss_curve(tmp_path):
    generator = np.random.default_rng(7)
    hidden = generator.standard_normal((FEATURES, CLASSES))
    arrays = {}
    for name, size in SIZES.items():
        inputs = generator.standard_normal((size, FEATURES)).astype(np.float32)
        arrays[name + "_x"] = inputs
        arrays[name + "_y"] = (inputs @ hidden + generator.standard_normal((size, CLASSES))).argmax(1).astype(np.int32)
    np.savez(tmp_path / "arrays.npz", **arrays)
    initial = {"kernel": 0.1 * generator.standard_normal((FEATURES, CLASSES)), "bias": np.zeros(CLASSES)}
    np.savez(tmp_path / "weights.npz", **{name: value.astype(np.float32) for name, value in initial.items()})
    paths = {"arrays": tmp_path / "arrays.npz", "weights": tmp_path / "weights.npz", "orders": tmp_path / "orders.npy"}
    files = {**paths, "features": FEATURES, "classes": CLASSES}

    torch_project = render(tmp_path, "torch", "single")
    (package(torch_project) / "data.py").write_text(TORCH_DATA.format(**files))
    (package(torch_project) / "model.py").write_text(TORCH_MODEL.format(**files))
    script = TORCH_ORDER.format(package=torch_project.name, size=SIZES["train"])
    order = run([sys.executable, "-c", script], cwd=torch_project, env={"PYTHONPATH": str(torch_project / "src")})
    assert order.returncode == 0, order.stdout
    np.save(paths["orders"], np.array(json.loads(order.stdout)))

    tf_project = render(tmp_path, "tensorflow", "one-device")
    (package(tf_project) / "data.py").write_text(TF_DATA.format(**files))
    (package(tf_project) / "model.py").write_text(TF_MODEL.format(**files))

    jax_project = render(tmp_path, "jax", "single")
    (package(jax_project) / "data.py").write_text(JAX_DATA.format(**files))
    (package(jax_project) / "model.py").write_text(JAX_MODEL.format(**files))

    torch_records, tf_records, jax_records = in_parallel(
        lambda: train(torch_project, "--device", "cpu"),
        lambda: train(tf_project, "--device", "cpu", "--shuffle-buffer", "1"),  # data.py gives torch's order
        lambda: train(jax_project),  # on the CPU: JAX_PLATFORMS
    )
    assert len(torch_records) == len(tf_records) == len(jax_records) == 3
    for torch_record, jax_record in zip(torch_records, jax_records, strict=True):
        assert jax_record["step"] == torch_record["step"]
        for name in ("train_loss", "val_loss"):
            assert jax_record[name] == pytest.approx(torch_record[name], rel=1e-4), (torch_record["epoch"], name)
        assert jax_record["val_accuracy"] == pytest.approx(torch_record["val_accuracy"], abs=1.01 / SIZES["val"])
    for torch_record, tf_record in zip(torch_records, tf_records, strict=True):
        assert tf_record["step"] == torch_record["step"] == 6 * torch_record["epoch"]
        assert tf_record["lr"] == pytest.approx(torch_record["lr"], rel=1e-5, abs=1e-9)
        for name in ("train_loss", "val_loss"):
            assert tf_record[name] == pytest.approx(torch_record[name], rel=1e-4), (torch_record["epoch"], name)
        assert tf_record["val_accuracy"] == pytest.approx(torch_record["val_accuracy"], abs=1.01 / SIZES["val"])
