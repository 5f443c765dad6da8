"""Training throughput of a freshly rendered tensorflow project against two baselines.

Renders a project with `looptpl new` into a temporary folder (one-device; mirrored with
--replicas N, over N logical CPU devices), imports its package, and times three loops on the
same model (the project's placeholder MLP), the same synthetic data (the project's task, with a
larger train split) and the same global batch:

  generated     the project's own `train.main()`, i.e. `Trainer.fit()` with the progress bar,
                the metric logger, validation and checkpoints on; only `train_epoch` is timed
  hand-written  tf.data (shuffle, batch, prefetch), a @tf.function step with GradientTape,
                AdamW with global_clipnorm, a running loss summed in Python; with --replicas N,
                TensorFlow's tutorial loop "Custom training with tf.distribute.Strategy": the
                same under MirroredStrategy, `strategy.run` per batch, the loss averaged with
                tf.nn.compute_average_loss, Keras summing the gradients over the replicas
  fit           model.compile + model.fit with the same AdamW and clipping, verbose=0,
                no validation; a callback times each epoch (under the strategy's scope)

Every loop runs one untimed warmup epoch (which also traces the tf.functions) and then --epochs
timed ones; the loops take turns within each of --rounds rounds (in a rotating order). The table
gives, per loop, the median and the spread of samples/s over rounds, the best single epoch, and
samples per CPU-second; the ratios are paired by round. The project's target: generated faster
than model.fit.

Run from the repository root (a few minutes on 2 shared CPU cores):
    .venv/bin/python bench/tf_loop.py
    .venv/bin/python bench/tf_loop.py --rounds 5 --epochs 2 --train-size 50000 --batch-size 64 --threads 1
    .venv/bin/python bench/tf_loop.py --replicas 2 --skip-fit   # mirrored, against the tutorial's loop
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # read when TensorFlow is imported, just below

import keras
import numpy as np
import tensorflow as tf
from timing import REPO, EpochClock, Timings, patched, pretend_tty, print_comparison, rate, template_revision

VAL_SIZE, TEST_SIZE = 251, 257  # the template's own evaluation split sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2, help="Timed epochs per run, after the warmup epoch.")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="Untimed epochs at the start of every run.")
    parser.add_argument("--train-size", type=int, default=50_000, help="Samples in the synthetic train split.")
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch size (the template's default).")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds; each runs every loop once.")
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow intra- and inter-op threads.")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="Replicas: 1 times a one-device project; N > 1 a mirrored one on N logical CPU devices "
        "(--cpu-replicas N), against TensorFlow's tutorial loop under MirroredStrategy.",
    )
    parser.add_argument(
        "--progress",
        choices=["tty", "real", "off"],
        default="tty",
        help="Generated loop's progress bar: tty makes sys.stderr.isatty() return True so the bar draws "
        "even when stderr is a file or pipe (default); real leaves stderr alone; off passes --no-progress.",
    )
    parser.add_argument(
        "--generated-flags", default="", help="Extra trainer flags for the generated loop, e.g. '--log-every 50'."
    )
    parser.add_argument(
        "--compare-flags",
        default="",
        help="Also time the generated loop with these extra flags, as the loop 'generated+' (e.g. '--jit-compile').",
    )
    parser.add_argument("--skip-fit", action="store_true", help="Time only generated and its hand-written baseline.")
    parser.add_argument("--keep", action="store_true", help="Keep the temporary project folder and print it.")
    args = parser.parse_args(argv)
    for name in ("epochs", "train_size", "batch_size", "rounds", "threads", "replicas"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def render_project(root: Path, strategy: str) -> types.ModuleType:
    """`looptpl new` a tensorflow project of `strategy` under `root` and import its package."""
    destination = root / "benchproj"
    looptpl = shutil.which("looptpl", path=str(Path(sys.executable).parent)) or "looptpl"
    command = [looptpl, "new", str(destination), "--backend", "tensorflow", "--strategy", strategy]
    subprocess.run([*command, "--defaults", "--no-git"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    (package_dir,) = [path for path in (destination / "src").iterdir() if (path / "train.py").exists()]
    sys.path.insert(0, str(destination / "src"))
    package = importlib.import_module(package_dir.name)
    for module in ("train", "data", "model"):
        setattr(package, module, importlib.import_module(f"{package_dir.name}.{module}"))
    package.config = importlib.import_module(f"{package_dir.name}.kit.config")
    return package


def build_arrays(project: types.ModuleType, train_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The project's synthetic task (data.py), with `train_size` training samples."""
    data = project.data
    generator = np.random.default_rng(1234)
    hidden = generator.standard_normal((data.NUM_FEATURES, 32))
    readout = generator.standard_normal((32, data.NUM_CLASSES))

    def make_split(size: int) -> tuple[np.ndarray, np.ndarray]:
        inputs = generator.standard_normal((size, data.NUM_FEATURES))
        return inputs.astype(np.float32), (np.tanh(inputs @ hidden) @ readout).argmax(axis=1).astype(np.int32)

    return [make_split(train_size), make_split(VAL_SIZE), make_split(TEST_SIZE)]


class Run:
    """What one loop needs: the data, the batch, the epochs, and where to write."""

    def __init__(self, args: argparse.Namespace, project: types.ModuleType, arrays: list, work: Path) -> None:
        self.args, self.project, self.arrays, self.work = args, project, arrays, work
        self.total_epochs = args.warmup_epochs + args.epochs
        self.defaults = project.config.TrainConfig()  # lr, weight decay, clipping: the template's defaults
        # One MirroredStrategy for every run of the process (the generated loop's too): collectives of
        # several strategies in one process get in each other's way.
        devices = [device.name for device in tf.config.list_logical_devices("CPU")]
        self.strategy = tf.distribute.MirroredStrategy(devices) if args.replicas > 1 else tf.distribute.get_strategy()

    def timed(self, clock: EpochClock) -> Timings:
        if len(clock.epochs) != self.total_epochs:
            raise RuntimeError(f"expected {self.total_epochs} timed epochs, got {len(clock.epochs)}")
        return clock.epochs[self.args.warmup_epochs :]

    def train_batches(self) -> tf.data.Dataset:
        """What a user writes: shuffle every epoch, batch, prefetch."""
        inputs, targets = self.arrays[0]
        dataset = tf.data.Dataset.from_tensor_slices((inputs, targets)).shuffle(len(targets), seed=0)
        return dataset.batch(self.args.batch_size).prefetch(tf.data.AUTOTUNE)

    def model_and_optimizer(self, strategy: tf.distribute.Strategy) -> tuple[keras.Model, keras.optimizers.Optimizer]:
        """The project's model with the seed its own run uses; AdamW as in its optim.py, Keras-clipped;
        built in `strategy`'s scope."""
        config = self.defaults
        keras.utils.set_random_seed(config.seed)
        with strategy.scope():
            model = self.project.model.build_model(config)
            clip = config.max_grad_norm
            optimizer = keras.optimizers.AdamW(config.lr, config.weight_decay, epsilon=1e-8, global_clipnorm=clip)
        return model, optimizer


def run_generated(run: Run, round_index: int, extra_flags: str = "") -> Timings:
    """The project's `train.main()` with the bigger train split; times `Trainer.train_epoch`."""
    project, args = run.project, run.args
    clock = EpochClock()

    class TimedTrainer(project.train.Trainer):  # type: ignore[name-defined,misc]
        def train_epoch(self, epoch: int) -> dict[str, float]:
            clock.start()
            result: dict[str, float] = super().train_epoch(epoch)
            clock.stop()
            return result

    def datasets(config: object) -> tuple[tf.data.Dataset, ...]:
        return tuple(tf.data.Dataset.from_tensor_slices(split) for split in run.arrays)

    run_dir = run.work / f"runs/generated{'+' if extra_flags else ''}-{round_index}"
    argv = ["--run-dir", str(run_dir), "--epochs", str(run.total_epochs)]
    if args.replicas > 1:
        argv += ["--cpu-replicas", str(args.replicas)]
    argv += ["--global-batch-size", str(args.batch_size), *args.generated_flags.split(), *extra_flags.split()]
    if args.progress == "off":
        argv.append("--no-progress")
    with (
        patched(project.train, Trainer=TimedTrainer, build_datasets=datasets),
        # main() set up the logical CPU devices (--replicas): the project's setup finds them in place, and
        # its MirroredStrategy is the one every run of this process shares.
        patched(tf.config, set_logical_device_configuration=lambda *_: None, set_visible_devices=lambda *_: None),
        patched(tf.distribute, MirroredStrategy=lambda *_, **__: run.strategy),
        pretend_tty(sys.stderr, args.progress == "tty"),
    ):
        code = project.train.main(argv)
    if code != 0:
        raise RuntimeError(f"generated train.main exited with {code}")
    return run.timed(clock)


def run_hand_written(run: Run, round_index: int) -> Timings:
    """What a competent user writes by hand: same model, data, batch, AdamW and clipping."""
    model, optimizer = run.model_and_optimizer(run.strategy)

    @tf.function
    def train_step(inputs: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            losses = keras.losses.sparse_categorical_crossentropy(targets, model(inputs, training=True), True)
            loss = tf.reduce_mean(losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return tf.reduce_sum(losses)

    clock = EpochClock()
    batches = run.train_batches()
    for epoch in range(run.total_epochs):
        clock.start()
        loss_sum = tf.constant(0.0)
        for inputs, targets in batches:
            loss_sum += train_step(inputs, targets)
        print(f"hand-written epoch {epoch + 1}: train_loss {float(loss_sum) / run.args.train_size:.4f}", flush=True)
        clock.stop()
    return run.timed(clock)


def run_tutorial(run: Run, round_index: int) -> Timings:
    """TensorFlow's tutorial "Custom training with tf.distribute.Strategy", with the same model, data,
    batch, AdamW and clipping: `strategy.run` per batch, the per-replica loss averaged over the global
    batch, Keras' apply_gradients summing the gradients over the replicas."""
    strategy, global_batch = run.strategy, run.args.batch_size
    model, optimizer = run.model_and_optimizer(strategy)
    with strategy.scope():
        # Under Keras 3 the optimizer's variables cannot be made inside the distributed step.
        optimizer.build(model.trainable_variables)

    def train_step(inputs: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            losses = keras.losses.sparse_categorical_crossentropy(targets, model(inputs, training=True), True)
            loss = tf.nn.compute_average_loss(losses, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return tf.reduce_sum(losses)

    @tf.function
    def distributed_train_step(batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=batch), axis=None)

    clock = EpochClock()
    batches = strategy.experimental_distribute_dataset(run.train_batches())
    for epoch in range(run.total_epochs):
        clock.start()
        loss_sum = tf.constant(0.0)
        for batch in batches:
            loss_sum += distributed_train_step(batch)
        print(f"tutorial epoch {epoch + 1}: train_loss {float(loss_sum) / run.args.train_size:.4f}", flush=True)
        clock.stop()
    return run.timed(clock)


def run_fit(run: Run, round_index: int) -> Timings:
    """model.compile + model.fit, everything optional off; a callback times each epoch."""
    model, optimizer = run.model_and_optimizer(run.strategy)
    with run.strategy.scope():
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    clock = EpochClock()

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            clock.start()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            clock.stop()

    model.fit(run.train_batches(), epochs=run.total_epochs, verbose=0, callbacks=[EpochTimer()])
    return run.timed(clock)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Before any op runs: TensorFlow fixes its thread pools once.
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    loops: dict[str, Callable[[Run, int], Timings]] = {"generated": run_generated}
    if args.replicas > 1:
        # As the project's --cpu-replicas does, once for every run of this process.
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
        loops["tutorial"] = run_tutorial
    else:
        loops["hand-written"] = run_hand_written
    if args.compare_flags:
        loops["generated+"] = functools.partial(run_generated, extra_flags=args.compare_flags)
    if not args.skip_fit:
        loops["fit"] = run_fit
    work = Path(tempfile.mkdtemp(prefix="looptpl-tf-bench-"))
    try:
        project = render_project(work, "mirrored" if args.replicas > 1 else "one-device")
        run = Run(args, project, build_arrays(project, args.train_size), work)
        timings: dict[str, list[Timings]] = {name: [] for name in loops}
        names = list(loops)
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        for round_index in range(args.rounds):
            shift = round_index % len(names)  # rotate, so no loop always runs first
            for name in names[shift:] + names[:shift]:
                keras.backend.clear_session()
                gc.collect()
                epochs = loops[name](run, round_index)
                timings[name].append(epochs)
                seconds = " ".join(f"{w:.3f}" for w, _ in epochs)
                print(
                    f"[round {round_index + 1}/{args.rounds}] {name:<12} {rate(args, epochs, 0):>9,.0f} samples/s "
                    f"({rate(args, epochs, 1):,.0f} per CPU-s); epochs {seconds} s",
                    flush=True,
                )
        report(args, timings, time.perf_counter() - started, (load_before, os.getloadavg()[0]))
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def report(
    args: argparse.Namespace, timings: dict[str, list[Timings]], elapsed: float, load: tuple[float, float]
) -> None:
    cores = os.cpu_count() or 1
    device = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    print(
        f"\ntensorflow {tf.__version__}, keras {keras.__version__}, {args.threads} thread(s) on {cores} CPUs, "
        f"{device}, {args.replicas} replica(s); train {args.train_size} samples, batch {args.batch_size}, "
        f"{args.warmup_epochs} warmup + {args.epochs} timed epochs x {args.rounds} rounds; "
        f"progress bar {args.progress}; generated flags "
        f"'{args.generated_flags}', generated+ adds '{args.compare_flags}'; template {template_revision()}; "
        f"{elapsed:.0f}s; "
        f"load average {load[0]:.1f} -> {load[1]:.1f}"
    )
    if max(load) > cores:
        print(f"warning: load average above {cores}: other processes share the CPUs, so expect noise")
    print_comparison(args, timings, {"fit": ">1.0"})


if __name__ == "__main__":
    sys.exit(main())
