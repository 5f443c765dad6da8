"""Train gan_mirrored: the whole loop on one page. Managed by the looptpl template.

Launch:
    python -m gan_mirrored.train                                  # every GPU of this machine, else the CPU
    CUDA_VISIBLE_DEVICES=0,1 python -m gan_mirrored.train         # two of its GPUs
    python -m gan_mirrored.train --cpu-replicas 2                 # 2 replicas on the CPU, no GPU needed
    # N machines: generate the multi-worker variant (looptpl new --strategy multi-worker)

Read it top to bottom: `main` sets up the strategy, `run` the data, `Trainer` builds the run
(models, optimizers, schedule) under the strategy's scope, `fit` runs the epochs and
`train_epoch` the updates, and `TrainStep` is the update itself, compiled: micro-steps, the exact
loss scaling, the gradient tape, the sum over replicas, clipping, `apply_gradients`. distributed.py
holds the strategy; your code lives in data.py, model.py, step.py, loss.py, metrics.py, optim.py,
hooks.py and settings.py. kit/ holds the machinery the loop calls in one line (checkpoints, data
order, logs, config, messages): you never need to open it to follow a run. `--help` lists every flag.
"""

import functools
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from .kit.contract import message
from .kit.errors import ConfigError, RunError, first_line, import_failure, in_your_code, report, three_datasets

# Before your files are imported: each function or class the loop calls that they lack, or that takes other
# arguments than the loop passes, in one line (an update of the template may have changed what it calls).
if mismatches := message(Path(__file__).parent):
    report(mismatches)
    sys.exit(1)

try:  # your files are imported here (settings.py by kit/config.py): a mistake in one is one line, not a traceback
    from . import distributed
    from .data import build_datasets, make_batches
    from .distributed import Runtime
    from .hooks import Hooks
    from .kit.callbacks import EarlyStopping, HookCaller, Run
    from .kit.checkpoint import Checkpointer, ConfigState, HooksState
    from .kit.collect import Mean, check_train_value, run_updates_in_a_loop
    from .kit.config import TrainConfig, check_resumable, parse_config
    from .kit.errors import StepError, TrainingError
    from .kit.evaluation import Evaluator, finite_or_raise
    from .kit.logs import MetricLogger, ProgressBar, UpdateSpeed
    from .kit.profiling import CallProfiler
    from .kit.rundir import prepare_run_dir
    from .kit.runs import closing_lines, opening_line
    from .kit.sampling import TrainSplit, distribute_eval, part, rows
    from .kit.schedules import check_floor
    from .kit.stages import (
        Stage,
        build_stages,
        check_all_used,
        grad_norms,
        mean_losses,
        micro_step_losses,
        next_loss,
        not_finite_message,
        split_models,
        updates_in_next_call,
    )
    from .kit.xla import compile_micro_step, xla_error
    from .metrics import dataset_metrics
    from .model import build_model
    from .optim import build_optimizer, build_schedule
    from .step import eval_step, train_step
except Exception as error:
    if (problem := import_failure(error)) is None:
        raise
    report(f"error: {problem}")
    sys.exit(1)

# The signals that stop a run, as people name them.
SIGNALS: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    try:
        # The strategy comes first: it sets up the devices
        # before any other TensorFlow op runs.
        return run(config, distributed.setup(config))
    except RunError as error:
        report(f"error: {error}", every_rank=error.on_every_rank)
        return error.exit_code
    except KeyboardInterrupt:  # Ctrl-C before training started, a second one during it, or one while testing
        report("error: stopped by Ctrl-C; a run that wrote a checkpoint continues with --resume")
        return 130
    except tf.errors.InvalidArgumentError as error:
        # A value the compiled step refused as it ran (a label out of range, a sample of another
        # shape): TensorFlow raises it from inside the graph, with no line of your code to name.
        print(
            f"error: a batch was refused ({first_line(error)}); check the samples data.py gives (labels in range, "
            "shapes) and make_batches",
            file=sys.stderr,
        )
        return 1


def run(config: TrainConfig, runtime: distributed.Runtime) -> int:
    """Train, test and write the summary; returns the exit status."""
    started = time.monotonic()
    config = prepare_run_dir(config, runtime)
    # The same seed in every run: the same data order and the same initial weights.
    keras.utils.set_random_seed(config.seed)
    with in_your_code("building the datasets"):
        datasets = build_datasets(config)
    trainer = Trainer(config, runtime, three_datasets(datasets))
    if runtime.is_main:  # the first line on the screen: where the run trains, and how much
        replicas = runtime.strategy.num_replicas_in_sync
        device = runtime.strategy.extended.worker_devices[0].rsplit("device:", 1)[-1].split(":")[0].lower()
        where = f"{device}, {replicas} replica{'s' if replicas > 1 else ''}"
        weights = sum(stage.model.count_params() for stage in trainer.stages)
        samples = trainer.train_split.size if trainer.train_split.size >= 0 else None
        shape = (trainer.epochs, trainer.updates_per_epoch, config.global_batch_size)
        print(opening_line(Path(config.run_dir), where, weights, samples, shape), flush=True)
    if config.resume:
        trainer.resume()
    summary = trainer.fit()
    if summary is None:
        if runtime.is_main:
            again = f"--resume --run-dir {config.run_dir}"
            print(f"stopped {trainer.stopped}, checkpointed; continue with {again}", flush=True)
        # 128 + the signal (130 for Ctrl-C, 143 for SIGTERM) tells a scheduler the job was stopped, not finished.
        return 128 + (trainer.stop_signal or signal.SIGTERM) if trainer.terminate else 0
    if runtime.is_main:
        (Path(config.run_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        took = time.monotonic() - started
        print("\n".join(closing_lines(summary, Path(config.run_dir), took, __package__)), flush=True)
    # The summary is written either way; a NaN test result still fails the run.
    finite_or_raise(summary, "the final test")
    return 0


PRECISION_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
# data.py's (train, val, test); the test set may be None.
Datasets = tuple[tf.data.Dataset, tf.data.Dataset, tf.data.Dataset | None]


class Trainer:
    """Owns the models, the optimizers and the input pipelines of one run, on this worker."""

    def __init__(self, config: TrainConfig, runtime: Runtime, datasets: Datasets) -> None:
        self.config = config
        self.runtime = runtime
        self.strategy = runtime.strategy
        self.run_dir = Path(config.run_dir)
        train_set, val_set, test_set = datasets
        eval_sets = {  # data.py's test set may be None: no final test
            split: distribute_eval(self.strategy, dataset, split, config, make_batches)
            for split, dataset in (("val", val_set), ("test", test_set))
            if dataset is not None
        }

        # Layers built from here on compute in bf16/fp16 (under those --precision values) and keep
        # float32 weights.
        keras.mixed_precision.set_dtype_policy(PRECISION_POLICIES[config.precision])
        # Everything that holds variables is created under the strategy's scope, which places each
        # variable (a copy on each replica's device, kept in sync) and ties it to the strategy.
        with self.strategy.scope():
            with in_your_code("building the model"):
                self.models = build_model(config)
            # Models without trainable weights (a distillation teacher) are only run: no optimizer,
            # not in the checkpoints (model.py loads their weights).
            trained, _ = split_models(self.models)
            self.train_split = TrainSplit(self.strategy, train_set, config, make_batches)
            self.updates_per_epoch = self.train_split.updates_per_epoch
            self.total_updates = config.max_steps or self.updates_per_epoch * config.epochs
            self.epochs = -(-self.total_updates // self.updates_per_epoch)  # with --max-steps the last may be partial
            with in_your_code("building the schedule"):
                schedule = check_floor(build_schedule(config, self.total_updates), config.min_lr)
            # One stage per optimizer, each updating the model of the same name (kit/stages.py).
            with in_your_code("building the optimizer"):
                self.stages = build_stages(build_optimizer(config, schedule), trained, config)
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)  # epochs completed
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False)  # updates applied
            # Written part-way through an epoch: its updates done, and its running totals (train_epoch).
            self.position = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.running = tf.Variable(tf.zeros([2, len(self.stages), 4], tf.float64), trainable=False)
            counters = (self.epoch, self.step, self.train_split.stream_position)
            self.train_step = TrainStep(config, runtime, self.models, self.stages, counters)
            watch = (config.monitor, config.monitor_mode, config.early_stop_patience)
            self.early_stopping = EarlyStopping(*watch, keep_validation=test_set is None)
            self.saved_config = ConfigState(config)
            # The trained models and their optimizers, by name with several (the checkpoint's keys).
            one = len(self.stages) == 1
            self.trained = self.stages[0].model if one else {stage.name: stage.model for stage in self.stages}
            optimizers = self.stages[0].optimizer if one else {stage.name: stage.optimizer for stage in self.stages}
            self.hooks_state = HooksState()
            self.checkpointer = self.make_checkpointer(optimizers)
        self.samples_trained = 0  # by this process, for the throughput
        self.terminate = False  # a signal asked the run to stop
        self.stop_signal, self.stop_asked = 0, 0.0  # SIGTERM or SIGINT (Ctrl-C), once one reached us, and when
        self.stopped = ""  # why fit() stopped before the end, in words
        self.logger = MetricLogger(self.run_dir, config) if runtime.is_main else None
        self.speed = UpdateSpeed()  # of the updates between two steps.jsonl records
        self.progress = ProgressBar(config.progress and runtime.is_main)
        # hooks.py sees what model.py and optim.py built.
        self.run = Run(config, self.models, optimizers, runtime.task_id, runtime.workers, runtime.is_main)
        self.hook = HookCaller(Hooks, config, self.run)
        user = (eval_step, dataset_metrics)
        self.evaluator = Evaluator(self.strategy, self.models, config, eval_sets, self.stages, user, self.progress)

    def make_checkpointer(self, optimizers: object) -> Checkpointer:
        """The Checkpointer of everything a resumed run needs (under the strategy's scope)."""
        return Checkpointer(
            self.run_dir,
            self.config.keep_checkpoints,
            self.runtime,
            model=self.trained,
            # Keras keeps each dropout layer's random state in a non-trainable variable that
            # tf.train.Checkpoint does not reach through the model: listed here, a resumed run
            # draws the same dropout masks as an uninterrupted one.
            non_trainable=[variable for stage in self.stages for variable in stage.model.non_trainable_variables],
            optimizer=optimizers,
            epoch=self.epoch,
            step=self.step,
            position=self.position,
            running=self.running,
            early_stopping=self.early_stopping,
            config=self.saved_config,
            hooks=self.hooks_state,
            **self.train_split.checkpointed(),
        )

    def fit(self) -> dict[str, Any] | None:
        """Train until --epochs, --max-steps or early stopping, then test and return the summary.

        Returns None when the run stops before its end (--stop-after-epoch, --stop-after-step, SIGTERM),
        with `stopped` saying why: it is checkpointed and unfinished, not tested.
        """
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        started = time.perf_counter()
        stopped_early = False
        updates = int(self.epoch.numpy()) * self.updates_per_epoch + int(self.position.numpy())
        if 0 < self.config.stop_after_epoch <= int(self.epoch.numpy()) or 0 < self.config.stop_after_step <= updates:
            self.stopped = f"after update {updates}"  # e.g. the launcher restarted the run after that checkpoint
            return None
        self.hook("on_run_start", self.run)
        for epoch in range(int(self.epoch.numpy()), self.epochs):
            epoch_started = time.perf_counter()
            trained = self.train_epoch(epoch)
            if trained is None:
                return None
            record: dict[str, Any] = {"epoch": epoch + 1, **trained, **self.evaluate("val")}
            record.update(step=int(self.step.numpy()), lr=float(self.stages[0].optimizer.learning_rate))
            record["epoch_time_s"] = round(time.perf_counter() - epoch_started, 3)
            finite_or_raise(record, f"epoch {epoch + 1}")  # never checkpoint NaN weights or pick them as the best
            # Every worker holds the same all-reduced metrics, so every worker computes the same result.
            is_best = self.early_stopping.update(record, epoch + 1)
            self.epoch.assign(epoch + 1)
            self.run.epoch = epoch + 1
            # Before the checkpoint, which holds the hooks' state as this hook leaves it.
            self.hook("on_epoch_end", self.run, record)
            if self.logger is not None:
                self.logger.log(record)
            if not int(self.position.numpy()):  # a run that ends part-way through this epoch was checkpointed before
                self.hooks_state.text = self.hook.state_json()
                self.checkpointer.save(epoch + 1, is_best)
            # The chief decides, every worker follows (with several, a collective: it waits for the checkpoint).
            if self.runtime.agree(self.early_stopping.should_stop):
                stopped_early = True
                break
            if self.runtime.any_worker(bool(self.run.stop_reason)):
                self.run.stop_reason = self.run.stop_reason or "a hook asked, on another worker"
                if self.logger is not None:
                    print(f"stopping: {self.run.stop_reason}", flush=True)
                stopped_early = True
                break
            self.terminate = self.runtime.any_worker(self.terminate)
            if self.terminate or epoch + 1 == self.config.stop_after_epoch:
                self.stopped = self.stopped_by() + f"after epoch {epoch + 1}"
                return None
            if (epoch + 1) * self.updates_per_epoch == self.config.stop_after_step:
                self.stopped = f"after update {self.config.stop_after_step}"
                return None
        return self.test(stopped_early, time.perf_counter() - started - self.evaluator.seconds)

    def train_epoch(self, epoch: int) -> dict[str, float] | None:
        """Train on (the rest of) one epoch; returns the mean training loss of each stage (and the skipped updates).

        Returns None when the run stops part-way through the epoch (--stop-after-step, SIGTERM),
        after a checkpoint that lets --resume continue from the same update. When the whole run ends
        part-way through the epoch (--max-steps, a hook), it is checkpointed there, before fit
        validates: a longer run resumed from it goes on with this epoch.
        """
        first = int(self.position.numpy())
        end = min(self.updates_per_epoch, self.total_updates - epoch * self.updates_per_epoch)
        self.hook("on_epoch_start", self.run, epoch + 1)
        self.progress.start(epoch + 1, self.epochs, end, first)
        # Summed over the epoch and since the last check, one row per stage: loss total and weight
        # of applied updates, all weight, skipped updates (TrainStep). A resumed epoch goes on
        # from the totals its checkpoint holds.
        epoch_totals, window = tf.unstack(self.running) if first else (tf.zeros([len(self.stages), 4], tf.float64),) * 2
        batches = iter(self.train_split.distribute(epoch, first))
        updates, samples, log_every = first, 0, self.config.log_every
        self.speed.restart(first, 0)
        while updates < end:
            # A call ends at the epoch's end and at every update that logs, checkpoints or validates.
            count = updates_in_next_call(self.config, updates, epoch * self.updates_per_epoch + updates, end)
            totals, call_samples = self.train_updates(batches, count, updates)
            epoch_totals, window = epoch_totals + totals, window + totals
            samples += int(call_samples)
            updates += count
            self.run.step = int(self.step.numpy())
            self.hook("after_update", self.run)
            in_run = epoch * self.updates_per_epoch + updates
            # The epoch end validates anyway (fit).
            validate = self.config.eval_every > 0 and in_run % self.config.eval_every == 0 and updates != end
            stop = False
            # The NaN check, progress and a steps.jsonl record every --log-every updates of the epoch, at
            # its end and at each validation. A run that ends part-way through an epoch is checked at its
            # end; its epoch record logs those last updates.
            logs = updates % log_every == 0 or updates == self.updates_per_epoch or validate
            if logs or updates == end:
                self.check_finite(epoch)
            if logs:
                self.log_window(window, epoch, updates, samples, validate)
                window = tf.zeros_like(window)
                # With several workers, a SIGTERM may reach some only: if any got one, all stop here.
                stop = self.terminate = self.runtime.any_worker(self.terminate)
                if self.runtime.any_worker(bool(self.run.stop_reason)):
                    end = updates  # a hook ends the run: this epoch ends here, and fit validates and checkpoints it
                    break
            if updates == end:
                break  # the epoch end checkpoints (fit)
            stop = stop or in_run == self.config.stop_after_step
            if stop or (self.config.checkpoint_every and in_run % self.config.checkpoint_every == 0):
                self.running.assign(tf.stack([epoch_totals, window]))
                self.save_within_epoch(epoch, updates)
                if stop:
                    self.progress.finish()
                    self.stopped = self.stopped_by() + f"after update {in_run}"
                    return None
        self.running.assign(tf.stack([epoch_totals, window]))
        self.samples_trained += samples
        self.train_split.check_trained(samples, first, end)
        return self.end_epoch(epoch, first, updates)

    def train_updates(self, batches: Iterator[Any], count: int, updates: int) -> tuple[tf.Tensor, tf.Tensor]:
        """The next `count` updates, from update `updates` of the epoch, in one call of TrainStep:
        their loss totals and their samples."""
        try:
            return self.train_step.call(batches, tf.constant(count))
        except tf.errors.OutOfRangeError:
            raise TrainingError(
                f"the train set ran out after {updates} of {self.updates_per_epoch} updates this epoch; "
                "data.py must give the same samples every epoch (a stream: every pass)"
            ) from None

    def check_finite(self, epoch: int) -> None:
        """Stop the run when --nan-policy gave up on a NaN/inf loss (on every worker alike)."""
        stage = self.train_step.gave_up()
        if stage is not None:
            where = f"epoch {epoch + 1}, step {int(self.step.numpy())}"
            raise TrainingError(not_finite_message(stage, self.stages, self.config, where))

    def end_epoch(self, epoch: int, first: int, updates: int) -> dict[str, float]:
        """The epoch's mean training loss of each stage (and the skipped updates), after update `updates`;
        a run that ends part-way through the epoch is checkpointed here, before fit validates."""
        self.progress.finish()
        if updates == self.updates_per_epoch:
            self.position.assign(0)
        elif updates > first:
            self.save_within_epoch(epoch, updates)
        totals = self.running[0].numpy()
        result = mean_losses(self.stages, totals)
        if self.config.nan_policy == "skip":
            result["skipped_updates"] = int(totals[:, 3].max())
        return result

    def save_within_epoch(self, epoch: int, updates: int) -> None:
        """Checkpoint after update `updates` of `epoch` (every worker calls this)."""
        self.position.assign(updates)
        self.hooks_state.text = self.hook.state_json()
        self.checkpointer.save_within_epoch(epoch * self.updates_per_epoch + updates)

    def log_window(self, window: tf.Tensor, epoch: int, updates: int, samples: int, validate: bool) -> None:
        """Show and log the training loss of the updates since the last call; validate if asked."""
        record: dict[str, Any] = {"epoch": epoch + 1, "step": int(self.step.numpy())}
        losses = mean_losses(self.stages, window.numpy())  # NaN where --nan-policy skip dropped every update
        record.update(losses, lr=float(self.stages[0].optimizer.learning_rate), **grad_norms(self.stages))
        self.progress.update(updates, samples, next(iter(losses.values())))
        record.update(self.speed.figures(updates, samples))  # reading the losses waited for the device
        if validate:
            record.update(self.evaluate("val"))
        record.update(self.hook.added("on_log", record))
        if self.logger is not None:
            self.logger.log_step(record)
        self.speed.restart(updates, samples)

    def evaluate(self, split: str) -> dict[str, float]:
        """The loss and metrics over every sample of `split` ("val" or "test"), each counted once."""
        results = self.evaluator.evaluate(split)
        return {**results, **self.hook.added("after_evaluation", split, results)}

    def resume(self) -> None:
        """Continue from the latest checkpoint in the run directory, at the update it was written after."""
        self.checkpointer.restore_latest(self.updates_per_epoch)
        saved = self.saved_config.saved
        check_resumable(self.config, saved)
        # The epoch of the run that wrote it: a stream's is that run's --max-steps, which this one may extend.
        streamed_for = saved.get("max_steps") if self.train_split.stream_position is not None else None
        per_epoch = streamed_for if isinstance(streamed_for, int) else self.updates_per_epoch
        done = int(self.epoch.numpy()) * per_epoch + int(self.position.numpy())
        if done > self.total_updates:
            config = self.config
            asked = f"--max-steps {config.max_steps}" if config.max_steps else f"--epochs {config.epochs}"
            raise ConfigError(
                f"--resume: the run in {self.run_dir} has done {done} updates, more than {asked} asks for "
                f"({self.total_updates}); ask for at least {done}, or start a new --run-dir"
            )
        epoch, position = divmod(done, self.updates_per_epoch)
        self.epoch.assign(epoch)
        self.position.assign(position)
        self.hook("load_state_dict", self.hooks_state.saved)
        self.run.epoch, self.run.step = epoch, int(self.step.numpy())
        problem = self.logger.keep_until(epoch, int(self.step.numpy())) if self.logger is not None else ""
        # Only the chief keeps the logs, but every worker must learn whether it could, or they would wait for it.
        if self.runtime.agree(bool(problem)):
            raise RunError(problem or "the chief could not read the run's logs; see its output")
        if self.logger is not None:
            print(f"resumed after update {done}, {self.place()}", flush=True)

    def place(self) -> str:
        """Where in its epochs the run is, in words (epochs counted from 1)."""
        epoch, position = int(self.epoch.numpy()), int(self.position.numpy())
        if position:
            return f"part-way through epoch {epoch + 1} (update {position} of {self.updates_per_epoch})"
        return f"the end of epoch {epoch}"

    def _request_stop(self, signum: int, frame: object) -> None:
        """SIGTERM or Ctrl-C: stop at the next --log-every boundary, with a checkpoint. A second Ctrl-C: now."""
        if self.stop_signal:
            # A launcher may hand a Ctrl-C on to its workers, which had it from the terminal: only a later one counts.
            if signum == signal.SIGINT and time.monotonic() - self.stop_asked > 1.0:
                raise KeyboardInterrupt
            return
        self.stop_signal, self.stop_asked, self.terminate = signum, time.monotonic(), True
        if self.runtime.is_main:
            again = " (Ctrl-C again to stop at once, without one)" if signum == signal.SIGINT else ""
            print(f"{SIGNALS[signum]}: stopping at the next --log-every boundary, with a checkpoint{again}", flush=True)

    def stopped_by(self) -> str:
        return f"by {SIGNALS[self.stop_signal or signal.SIGTERM]} " if self.terminate else ""

    def test(self, stopped_early: bool, train_seconds: float) -> dict[str, Any]:
        """Evaluate the best (or last) weights on the test set and return the summary.

        Without a test set (data.py's is None) the summary gives the best epoch's validation figures.
        """
        signal.signal(signal.SIGINT, signal.default_int_handler)  # training is over: Ctrl-C stops at once
        summary: dict[str, Any] = {
            "epochs_run": int(self.epoch.numpy()),
            "steps": int(self.step.numpy()),
            "stopped_early": stopped_early,
            "best_epoch": int(self.early_stopping.best_epoch.numpy()),
            f"best_{self.config.monitor}": self.early_stopping.best_value(),
        }
        if self.early_stopping.best_validation is not None:  # data.py has no test set
            summary.update(self.early_stopping.best_validation.figures)
        else:
            summary.update(tested_checkpoint=self.load_tested(), **self.evaluate("test"))
        if self.samples_trained:  # a finished run tested again trains nothing
            # Training alone: the time spent validating is eval_time_s, with the test's.
            summary["train_time_s"] = round(train_seconds, 2)
            summary["train_samples_per_s"] = round(self.samples_trained / max(train_seconds, 1e-9), 1)
        summary["eval_time_s"] = round(self.evaluator.seconds, 2)
        if self.run.stop_reason:
            summary["stop_reason"] = self.run.stop_reason
        self.hook("on_run_end", self.run, summary)
        if self.logger is not None:
            self.logger.close(summary)
        return summary

    def load_tested(self) -> str:
        """Load the weights the final test uses (--test-on), and say which they are."""
        if self.config.test_on == "last":
            return "last"
        best_epoch = int(self.early_stopping.best_epoch.numpy())
        if int(self.position.numpy()) and best_epoch == int(self.epoch.numpy()):
            return f"best (epoch {best_epoch}, the final weights)"  # validated part-way: never saved in best/
        tested = self.checkpointer.load_best(self.trained)
        return f"best (epoch {best_epoch})" if tested == "best" else tested


SUM = tf.distribute.ReduceOp.SUM

# One micro-step's gradients of its loss total / --global-batch-size, its loss total and its weight.
MicroStep = tuple[list[Any], tf.Tensor, tf.Tensor]


class TrainStep:
    """Applies updates; `call(batches, count)` returns their summed totals and samples.

    The totals hold one row per stage (optimizer): [loss total kept, weight kept, weight, updates
    skipped], where "kept" counts applied updates only: a skipped update's loss is left out of the
    training loss. Build it under `strategy.scope()`: its counters are variables, kept alike on every replica.
    """

    def __init__(
        self,
        config: TrainConfig,
        runtime: Runtime,
        models: keras.Model | dict[str, keras.Model],
        stages: list[Stage],
        counters: tuple[tf.Variable, tf.Variable, tf.Variable | None],
    ) -> None:
        self.config = config
        self.strategy = runtime.strategy
        self.replicas = self.strategy.num_replicas_in_sync
        self.models = models  # what model.py built, handed to step.py as it is
        self.stages = stages
        # Epochs completed, updates applied (by any stage), and for a streamed train set, the stream
        # position of the last global batch trained on (kit/sampling.py; None for a map-style one).
        self.epoch, self.step, self.stream_position = counters
        config.check_batch_split(self.replicas)  # full batches split into equal micro-batches
        # --nan-policy stop allows no skipped update: the first one stops the run.
        self.allowed_skips = config.max_consecutive_skips if config.nan_policy == "skip" else 0
        self.warn_on_skip = config.nan_policy == "skip" and runtime.is_main
        # Traced once: every epoch's iterator has the same element spec, which fixes every dimension
        # but the batch size, so the short last batch runs the same graph, not a retrace (with several
        # workers, a retrace on one alone would also leave the workers' collectives out of step).
        self.compiled = tf.function(self._updates)
        # --jit-compile: XLA compiles each micro-step whole, forward and backward (kit/xla.py).
        self.jit_micro_step = compile_micro_step(self._whole_micro_step, stages) if config.jit_compile else None
        run_updates_in_a_loop(config.steps_per_call > 1)
        self.profiler = CallProfiler(config.profile, Path(config.run_dir), runtime)  # --profile

    def call(self, batches: Iterator, count: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Run the next `count` updates from `batches`, compiled; returns their totals and samples."""
        try:
            result = self.compiled(batches, count)
        except tf.errors.InvalidArgumentError as error:
            if self.jit_micro_step is None:
                raise
            raise xla_error(error) from None
        self.profiler.step()
        return result

    def _updates(self, batches: Iterator, count: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """`count` updates, one per global batch taken from `batches`, in a loop inside the graph.

        Python runs once per call, not once per update: for a small model, per-update Python
        overhead would cost as much as the update itself.
        """
        totals = tf.zeros([len(self.stages), 4], tf.float64)
        samples = tf.constant(0, tf.int64)
        for _ in tf.range(count):
            batch = next(batches)
            if self.stream_position is not None:  # each global batch of a stream comes with its position
                position, batch = batch
                self.stream_position.assign(self.strategy.experimental_local_results(position)[0])
            update_totals, update_samples = self._update(batch)
            totals += update_totals
            samples += update_samples
        return totals, samples

    # Traced as the plain Python it is (loops over stages and micro-batches; tf.cond decides a skip), not
    # rewritten by AutoGraph, which for it and all it calls cost seconds at every start.
    @tf.autograph.experimental.do_not_convert
    def _update(self, batch: Any) -> tuple[tf.Tensor, tf.Tensor]:
        """One update of every stage on one global batch; returns its totals and samples."""
        sums, applied, samples = self.strategy.run(self._replica_update, args=(batch,))
        # Every replica holds the same all-reduced sums and decisions: take the first one's.
        sums = self.strategy.experimental_local_results(sums)[0]
        applied = self.strategy.experimental_local_results(applied)[0]
        self.step.assign_add(tf.cast(tf.reduce_any(applied), tf.int64))
        total, weight = sums[:, 0], sums[:, 1]
        kept = tf.cast(applied, tf.float64)
        totals = tf.stack([tf.where(applied, total, tf.zeros_like(total)), kept * weight, weight, 1.0 - kept], axis=1)
        return totals, tf.cast(self.strategy.reduce(SUM, samples, axis=None), tf.int64)

    def _replica_update(self, batch: Any) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """This replica's part of one update: for each stage, its micro-steps, then its update.

        Returns the global [loss total, weight] of each stage, which stages applied their update,
        and this replica's number of samples.
        """
        # Near-equal micro-batches, each with at least one sample (kit/sampling.py keeps a short last
        # batch only then): a short batch is spread evenly, not left to the last micro-step.
        parts = self.config.grad_accum_steps
        micro_batches = [part(batch, index, parts) for index in range(parts)]
        # A micro-step's forward runs up to its stage's loss: with one optimizer, train_step's Mean; with several
        # (a GAN), the loss step.py yields next, resumed stage by stage after the previous stage's update.
        steps = [self.losses(micro_batch) for micro_batch in micro_batches] if len(self.stages) > 1 else []
        sums, applied = [], []
        for stage in self.stages:
            if self.jit_micro_step:  # --jit-compile (one optimizer): each micro-step runs whole, compiled by XLA
                micro_steps = [functools.partial(self.jit_micro_step, micro_batch) for micro_batch in micro_batches]
            else:
                forwards = (
                    [functools.partial(next_loss, losses, stage, self.stages) for losses in steps]
                    if steps
                    else [functools.partial(self.train_loss, micro_batch) for micro_batch in micro_batches]
                )
                micro_steps = [functools.partial(self._micro_step, stage, forward) for forward in forwards]
            grads, total, weight = self._gradients(stage, micro_steps)
            # Under fp16 the gradients still carry the loss scale S (the LossScaleOptimizer divides it
            # out): their norm is S times the true one, and clipping S*g at S*max_norm clips g at max_norm.
            loss_scale = stage.optimizer.scale_loss(1.0)
            scaled_norm = tf.linalg.global_norm(grads)
            finite = tf.math.is_finite(total)
            if self.config.precision != "fp16":
                # (Under fp16, inf gradients mean the loss scale overflowed: the LossScaleOptimizer skips
                # such an update itself and lowers the scale.)
                finite &= tf.math.is_finite(scaled_norm)
            if self.config.max_grad_norm > 0:
                grads, _ = tf.clip_by_global_norm(grads, self.config.max_grad_norm * loss_scale, use_norm=scaled_norm)
            # The update (or its skip) is decided once for all replicas, outside the replica context:
            # TensorFlow does not allow a cond around apply_gradients inside it.
            loss, norm = total / tf.maximum(weight, 1e-12), scaled_norm / loss_scale
            merge = functools.partial(self._apply_or_skip, stage)
            applied.append(tf.distribute.get_replica_context().merge_call(merge, args=(grads, finite, loss, norm)))
            sums.append(tf.cast(tf.stack([total, weight]), tf.float64))
        check_all_used(steps, self.stages)
        return tf.stack(sums), tf.stack(applied), rows(batch)

    def _gradients(self, stage: Stage, micro_steps: Sequence[Callable[[], MicroStep]]) -> MicroStep:
        """The stage's gradients of the exact global mean loss, and its global loss total and weight.

        The update must follow the gradient of the global mean loss, sum_i(w_i l_i) / sum_i(w_i),
        over every replica and micro-step. The weight sum is only known once every micro-step has
        run, so each micro-step takes the gradient of its total / --global-batch-size (with one
        loss per sample that is already the right scale), and once summed over the replicas the
        gradients are multiplied by --global-batch-size / sum_i(w_i): the exact mean, for a short
        last batch, padded tokens or masks alike. With one loss per sample and a full batch the
        factor is exactly 1.

        Each stage records its own gradient tape: what an earlier stage computed (a GAN's generated
        images) carries no gradient into a later one, which computes it again.
        """
        grads = [tf.zeros(variable.shape, variable.dtype) for variable in stage.variables]
        total, weight = tf.constant(0.0), tf.constant(0.0)
        for index, micro_step in enumerate(micro_steps):
            # One micro-step at a time: accumulation is there to bound memory, so no overlap.
            with tf.control_dependencies(grads if index else []):
                micro_grads, micro_total, micro_weight = micro_step()
            grads = [grad if new is None else grad + new for grad, new in zip(grads, micro_grads, strict=True)]
            total, weight = total + micro_total, weight + micro_weight
        if self.replicas > 1:  # one all-reduce sums the replicas' gradients, loss totals and weights
            *grads, total, weight = tf.distribute.get_replica_context().all_reduce(SUM, [*grads, total, weight])
        factor = self.config.global_batch_size / tf.maximum(weight, 1e-12)
        return [grad * factor for grad in grads], total, weight

    def _micro_step(self, stage: Stage, forward: Callable[[], Mean]) -> MicroStep:
        """The stage's part of one micro-step: `forward()` runs step.py up to the stage's loss, then its gradients."""
        with tf.GradientTape() as tape:
            loss = forward()
            total, penalty = loss.total, stage.penalty()  # model.py's regularizers and add_loss() values
            if penalty is not None:
                # Micro-batch k's penalty p_k counts as if added to each of its values: with W_k its weight,
                # the update (_gradients) follows the global mean loss + sum_k(W_k p_k) / sum_k(W_k). A weight
                # penalty, the same in every micro-batch, counts once per update; an activity penalty (Keras'
                # mean over the micro-batch's samples) becomes the global batch's mean when a sample weighs 1.
                total += loss.weight * penalty
            scaled = stage.optimizer.scale_loss(total / self.config.global_batch_size)  # fp16: times S
        grads = tape.gradient(scaled, stage.variables)
        if all(grad is None for grad in grads):
            raise StepError(
                f"the {stage.name!r} loss from train_step does not depend on model.py's {stage.name!r} weights; "
                "compute it from that model's outputs inside its stage (after the previous yield)"
            )
        return grads, loss.total, loss.weight

    def _whole_micro_step(self, micro_batch: Any) -> MicroStep:
        """A micro-step of the one optimizer, from step.py's first line to its gradients (--jit-compile)."""
        return self._micro_step(self.stages[0], functools.partial(self.train_loss, micro_batch))

    def _apply_or_skip(
        self, stage: Stage, strategy: tf.distribute.Strategy, grads: Any, finite: Any, loss: Any, norm: Any
    ) -> tf.Tensor:
        """Apply the stage's update on every replica, or skip it; runs once, in the cross-replica context.

        An update with a NaN/inf loss or gradient is skipped on every replica alike: the weights, the
        optimizer state and so the schedule stay as they were. Once more updates in a row are skipped
        than allowed, nothing is applied any more and the loop stops the run.
        """
        # Each replica computed `finite`, the loss and the norm from the same all-reduced sums: take the first.
        finite, loss, norm = (strategy.experimental_local_results(value)[0] for value in (finite, loss, norm))
        stage.grad_norm.assign(norm)
        apply = finite & (stage.skips_in_a_row <= self.allowed_skips)

        def apply_update() -> None:
            strategy.extended.call_for_each_replica(self._apply_gradients, args=(stage, grads))

        tf.cond(apply, apply_update, lambda: self._skip(stage, loss))
        stage.skips_in_a_row.assign(tf.where(apply, tf.zeros_like(stage.skips_in_a_row), stage.skips_in_a_row + 1))
        return apply

    def _apply_gradients(self, stage: Stage, grads: list[tf.Tensor]) -> None:
        """Update the stage's weights with its clipped global gradient: every replica applies its copy of
        it to its copy of the weights (the optimizer does not sum it over the replicas again: build_stages)."""
        stage.optimizer.apply_gradients(zip(grads, stage.variables, strict=True))

    def _skip(self, stage: Stage, loss: tf.Tensor) -> None:
        stage.skipped_loss.assign(tf.cast(loss, tf.float64))
        if self.warn_on_skip:
            # Warn for each skip the policy allows and for the one that ends the run, not after it.
            tf.cond(stage.skips_in_a_row <= self.allowed_skips, lambda: self._warn(stage, loss), lambda: None)

    def _warn(self, stage: Stage, loss: tf.Tensor) -> None:
        which = "" if len(self.stages) == 1 else f" of {stage.name}"
        message = "warning: NaN/inf loss or gradients" + which + " at epoch {}, step {}: update skipped"
        message += " (training loss {})"
        tf.print(tf.strings.format(message, (self.epoch + 1, self.step, loss)), output_stream=sys.stderr)

    def train_loss(self, micro_batch: Any) -> Mean:
        """step.py's loss for one micro-batch, with one optimizer."""
        with in_your_code("in train_step"):
            loss = train_step(self.models, micro_batch, self.config)
        return check_train_value(loss, self.stages[0].name)

    def losses(self, micro_batch: Any) -> Iterator[tuple[str, Mean]]:
        """step.py's losses for one micro-batch with several optimizers, one per stage; nothing runs before
        the first is asked for."""
        return micro_step_losses(train_step, self.models, micro_batch, self.config, self.stages[0].name)

    def gave_up(self) -> Stage | None:
        """The stage that skipped more updates in a row than the NaN policy allows, if any."""
        return next((stage for stage in self.stages if int(stage.skips_in_a_row.numpy()) > self.allowed_skips), None)


if __name__ == "__main__":
    sys.exit(main())
