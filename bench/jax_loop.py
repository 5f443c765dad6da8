"""Training throughput of a freshly rendered JAX project against a hand-written JAX loop.

Renders a jax/single project with `looptpl new` into a temporary folder, imports its package, and
times two loops on the same model (the project's placeholder MLP, dropout 0.1), the same synthetic
data (the project's task, with a larger train split), the same optimizer (the project's optim.py,
clipped to --max-grad-norm) and the same global batch:

  generated     the project's own `train.main()`: `Trainer.fit()` with the progress bar, the logs,
                validation and checkpoints on; only `train_epoch` is timed
  hand-written  what a JAX user writes: a shuffled index per epoch, NumPy rows sliced per batch, one
                `jax.jit` step (value_and_grad of the batch's mean loss, the optimizer, buffers donated),
                dropout from one key per step, the loss summed on the device and read once an epoch

The generated loop does more per update on purpose: per-sample dropout keys (the same masks on any
device count), the weighted sums of the exact global-batch mean, the padded last batch (no second
compile) and a loss check every --log-every updates. Every loop runs one untimed warmup epoch (the
compiles) and then --epochs timed ones, taking turns within each of --rounds rounds in a rotating
order; the ratios are paired by round. The project's target: generated >= 0.95x hand-written.

Run from the repository root (about a minute on 2 idle CPU cores):
    .venv/bin/python bench/jax_loop.py
    .venv/bin/python bench/jax_loop.py --rounds 7 --batch-size 16
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from timing import REPO, EpochClock, Timings, patched, pretend_tty, print_comparison, rate, template_revision

TARGET_RATIO = 0.95  # generated / hand-written, as the project states it
VAL_SIZE, TEST_SIZE = 251, 257  # the template's own evaluation split sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2, help="Timed epochs per run, after the warmup epoch.")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="Untimed epochs at the start of every run.")
    parser.add_argument("--train-size", type=int, default=50_000, help="Samples in the synthetic train split.")
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch size (the template's default).")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds; each runs every loop once.")
    parser.add_argument("--keep", action="store_true", help="Keep the temporary project folder and print it.")
    args = parser.parse_args(argv)
    for name in ("epochs", "train_size", "batch_size", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def render_project(root: Path) -> types.ModuleType:
    """`looptpl new` a jax/single project under `root` and import its package."""
    destination = root / "jaxbench"
    command = [sys.executable, "-m", "looptpl", "new", str(destination), "--backend", "jax", "--strategy", "single"]
    environment = {**os.environ, "PYTHONPATH": str(REPO / "generator")}
    subprocess.run(
        [*command, "--defaults", "--no-git"], check=True, cwd=REPO, env=environment, stdout=subprocess.DEVNULL
    )
    sys.path.insert(0, str(destination / "src"))
    package = importlib.import_module("jaxbench")
    for module in ("train", "data", "model", "optim"):
        setattr(package, module, importlib.import_module(f"jaxbench.{module}"))
    package.config = importlib.import_module("jaxbench.kit.config")
    return package


def build_datasets(project: types.ModuleType, train_size: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """The project's synthetic task (data.py), with `train_size` training samples."""
    data = project.data
    generator = np.random.default_rng(1234)
    hidden = generator.normal(size=(data.NUM_FEATURES, 32)).astype(np.float32)
    readout = generator.normal(size=(32, data.NUM_CLASSES)).astype(np.float32)

    def make_split(size: int) -> tuple[np.ndarray, np.ndarray]:
        inputs = generator.normal(size=(size, data.NUM_FEATURES)).astype(np.float32)
        return inputs, (np.tanh(inputs @ hidden) @ readout).argmax(axis=1).astype(np.int32)

    return make_split(train_size), make_split(VAL_SIZE), make_split(TEST_SIZE)


def run_generated(
    args: argparse.Namespace, project: types.ModuleType, datasets: tuple, work: Path, round_index: int
) -> Timings:
    """The project's `train.main()` with the bigger train split; times `Trainer.train_epoch`."""
    train_module = project.train
    clock = EpochClock()

    class TimedTrainer(train_module.Trainer):  # type: ignore[name-defined,misc]
        def train_epoch(self, epoch: int) -> float | None:
            if self.order.size != args.train_size:
                raise RuntimeError(f"generated loop trains {self.order.size} samples an epoch, not {args.train_size}")
            clock.start()
            result: float | None = super().train_epoch(epoch)
            jax.block_until_ready(self.state)
            clock.stop()
            return result

    argv = ["--run-dir", str(work / f"runs/generated-{round_index}"), "--epochs", str(args.warmup_epochs + args.epochs)]
    argv += ["--global-batch-size", str(args.batch_size)]
    with (
        patched(train_module, Trainer=TimedTrainer, build_datasets=lambda config: datasets),
        pretend_tty(sys.stderr, True),
    ):
        code = train_module.main(argv)
    if code != 0:
        raise RuntimeError(f"generated train.main exited with {code}")
    return clock.epochs[args.warmup_epochs :]


def run_hand_written(
    args: argparse.Namespace, project: types.ModuleType, datasets: tuple, work: Path, round_index: int
) -> Timings:
    """What a competent JAX user writes by hand: same model, data, optimizer, clipping and batch."""
    config = project.config.TrainConfig()
    inputs, targets = datasets[0]
    updates_per_epoch = -(-len(inputs) // args.batch_size)
    epochs = args.warmup_epochs + args.epochs
    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        project.optim.build_optimizer(config, updates_per_epoch * epochs),
    )
    graphdef, params = nnx.split(project.model.build_model(config, nnx.Rngs(config.seed)))
    opt_state = optimizer.init(params)

    def forward(params: nnx.State, batch_inputs: jax.Array, key: jax.Array) -> jax.Array:
        model = nnx.merge(graphdef, params)
        hidden = nnx.relu(model.hidden(batch_inputs))  # the placeholder Classifier, dropout drawn here
        keep = jax.random.bernoulli(key, 0.9, hidden.shape)
        return model.output(jnp.where(keep, hidden / 0.9, 0.0))

    def step(params, opt_state, loss_sum, batch_inputs, batch_targets, key):  # type: ignore[no-untyped-def]
        def loss_fn(params: nnx.State) -> jax.Array:
            logits = forward(params, batch_inputs, key)
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch_targets).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        changes, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, changes), opt_state, loss_sum + loss * len(batch_targets)

    step = jax.jit(step, donate_argnums=(0, 1, 2))
    key = jax.random.key(config.seed)
    shuffle = np.random.default_rng(config.seed)
    clock = EpochClock()
    for epoch in range(epochs):
        clock.start()
        order = shuffle.permutation(len(inputs))
        loss_sum = jnp.zeros(())
        for start in range(0, len(inputs), args.batch_size):
            rows = order[start : start + args.batch_size]
            key, draw = jax.random.split(key)
            params, opt_state, loss_sum = step(params, opt_state, loss_sum, inputs[rows], targets[rows], draw)
        print(f"hand-written epoch {epoch + 1}: train_loss {float(loss_sum) / len(inputs):.4f}", flush=True)
        clock.stop()
    return clock.epochs[args.warmup_epochs :]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loops = {"generated": run_generated, "hand-written": run_hand_written}
    work = Path(tempfile.mkdtemp(prefix="looptpl-jax-bench-"))
    try:
        project = render_project(work)
        datasets = build_datasets(project, args.train_size)
        timings: dict[str, list[Timings]] = {name: [] for name in loops}
        names = list(loops)
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        for round_index in range(args.rounds):
            shift = round_index % len(names)  # rotate, so no loop always runs first
            for name in names[shift:] + names[:shift]:
                gc.collect()
                epochs = loops[name](args, project, datasets, work, round_index)
                timings[name].append(epochs)
                seconds = " ".join(f"{wall:.3f}" for wall, _ in epochs)
                print(
                    f"[round {round_index + 1}/{args.rounds}] {name:<12} {rate(args, epochs, 0):>9,.0f} samples/s "
                    f"({rate(args, epochs, 1):,.0f} per CPU-s); epochs {seconds} s",
                    flush=True,
                )
        elapsed = time.perf_counter() - started
        load = (load_before, os.getloadavg()[0])
        cores = os.cpu_count() or 1
        print(
            f"\njax {jax.__version__} on {jax.devices()[0].platform}, {cores} CPUs; train {args.train_size} samples, "
            f"batch {args.batch_size}, {args.warmup_epochs} warmup + {args.epochs} timed epochs x {args.rounds} "
            f"rounds; template {template_revision()}; {elapsed:.0f}s; load average {load[0]:.1f} -> {load[1]:.1f}"
        )
        if max(load) > cores:
            print(f"warning: load average above {cores}: other processes share the CPUs, so expect noise")
        print_comparison(args, timings, {"hand-written": str(TARGET_RATIO)})
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
