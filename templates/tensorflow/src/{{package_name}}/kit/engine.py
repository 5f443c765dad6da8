"""The training loop: train and validate every epoch, checkpoint, then test.

A run is --epochs passes over the train set, or --max-steps updates. It checkpoints at every
epoch end and, with --checkpoint-every, part-way through an epoch; --resume continues from the
newest checkpoint exactly as if the run had not stopped. SIGTERM (what Slurm and Kubernetes send
before a kill) stops the run at the next --log-every boundary, with a checkpoint.

Managed by the looptpl template: put your own code in step.py, model.py, data.py, loss.py,
metrics.py, optim.py, settings.py and hooks.py.
"""

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from ..distributed import Runtime
from ..hooks import Hooks
from ..model import build_model
from ..optim import build_optimizer, build_schedule
from .callbacks import EarlyStopping, HookCaller, Run
from .checkpoint import Checkpointer, ConfigState, HooksState
from .config import TrainConfig, check_resumable
from .ema import WeightAverage
from .errors import ConfigError, RunError, TrainingError, in_your_code
from .evaluation import Evaluator, finite_or_raise
from .logs import MetricLogger, ProgressBar
from .sampling import TrainSplit, distribute_eval
from .stages import build_stages, grad_norms, mean_losses, not_finite_message, split_models
from .train_step import TrainStep

PRECISION_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


class Trainer:
    """Owns the models, the optimizers and the input pipelines of one run, on this worker."""

    def __init__(
        self, config: TrainConfig, runtime: Runtime, datasets: tuple[tf.data.Dataset, tf.data.Dataset, tf.data.Dataset]
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.strategy = runtime.strategy
        self.run_dir = Path(config.run_dir)
        train_set, val_set, test_set = datasets
        eval_sets = {
            "val": distribute_eval(self.strategy, val_set, "val", config.eval_batch_size),
            "test": distribute_eval(self.strategy, test_set, "test", config.eval_batch_size),
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
            self.train_split = TrainSplit(self.strategy, train_set, config)
            self.updates_per_epoch = self.train_split.updates_per_epoch
            self.total_updates = config.max_steps or self.updates_per_epoch * config.epochs
            self.epochs = -(-self.total_updates // self.updates_per_epoch)  # with --max-steps the last may be partial
            with in_your_code("building the schedule"):
                schedule = build_schedule(config, self.total_updates)
            # One stage per optimizer, each updating the model of the same name (stages.py).
            with in_your_code("building the optimizer"):
                self.stages = build_stages(build_optimizer(config, schedule), trained, config)
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)  # epochs completed
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False)  # updates applied
            # Written part-way through an epoch: its updates done, and its running totals (train_epoch).
            self.position = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.running = tf.Variable(tf.zeros([2, len(self.stages), 4], tf.float64), trainable=False)
            counters = (self.epoch, self.step, self.train_split.stream_position)
            self.train_step = TrainStep(config, runtime, self.models, self.stages, counters)
            self.early_stopping = EarlyStopping(config.monitor, config.monitor_mode, config.early_stop_patience)
            self.saved_config = ConfigState(config)
            # The trained models and their optimizers, by name with several (the checkpoint's keys).
            one = len(self.stages) == 1
            self.trained = self.stages[0].model if one else {stage.name: stage.model for stage in self.stages}
            optimizers = self.stages[0].optimizer if one else {stage.name: stage.optimizer for stage in self.stages}
            self.hooks_state = HooksState()
            self.checkpointer = self.make_checkpointer(optimizers)
        self.samples_trained = 0  # by this process, for the throughput
        self.terminate = False  # a SIGTERM arrived
        self.stopped = ""  # why fit() stopped before the end, in words
        self.logger = MetricLogger(self.run_dir, config) if runtime.is_main else None
        self.progress = ProgressBar(config.progress and runtime.is_main)
        # hooks.py sees what model.py and optim.py built.
        self.run = Run(config, self.models, optimizers, runtime.task_id, runtime.workers, runtime.is_main)
        self.hook = HookCaller(Hooks, config, self.run)
        ema = WeightAverage([(stage.optimizer, stage.variables) for stage in self.stages]) if config.ema_decay else None
        self.evaluator = Evaluator(self.strategy, self.models, config, eval_sets, ema)

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
        self.progress.start(epoch + 1, self.epochs, end)
        # Summed over the epoch and since the last check, one row per stage: loss total and weight
        # of applied updates, all weight, skipped updates (train_step.py). A resumed epoch goes on
        # from the totals its checkpoint holds.
        epoch_totals, window = tf.unstack(self.running) if first else (tf.zeros([len(self.stages), 4], tf.float64),) * 2
        batches = iter(self.train_split.distribute(epoch, first))
        updates, samples, log_every = first, 0, self.config.log_every
        while updates < end:
            # A call ends at the epoch's end and at every update that logs, checkpoints or validates.
            count = self.train_step.updates_in_next_call(updates, epoch * self.updates_per_epoch + updates, end)
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
                    self.stopped = ("by SIGTERM " if self.terminate else "") + f"after update {in_run}"
                    return None
        self.running.assign(tf.stack([epoch_totals, window]))
        self.samples_trained += samples
        self.train_split.check_trained(samples, first, end)
        return self.end_epoch(epoch, first, updates)

    def train_updates(self, batches: Iterator[Any], count: int, updates: int) -> tuple[tf.Tensor, tf.Tensor]:
        """The next `count` updates, from update `updates` of the epoch, in one call of train_step.py:
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
        if validate:
            record.update(self.evaluate("val"))
        record.update(self.hook.added("on_log", record))
        if self.logger is not None:
            self.logger.log_step(record)

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
        if not self.terminate and self.runtime.is_main:
            print("SIGTERM: stopping at the next --log-every boundary, with a checkpoint", flush=True)
        self.terminate = True

    def fit(self) -> dict[str, Any] | None:
        """Train until --epochs, --max-steps or early stopping, then test and return the summary.

        Returns None when the run stops before its end (--stop-after-epoch, --stop-after-step, SIGTERM),
        with `stopped` saying why: it is checkpointed and unfinished, not tested.
        """
        signal.signal(signal.SIGTERM, self._request_stop)
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
                self.stopped = ("by SIGTERM " if self.terminate else "") + f"after epoch {epoch + 1}"
                return None
            if (epoch + 1) * self.updates_per_epoch == self.config.stop_after_step:
                self.stopped = f"after update {self.config.stop_after_step}"
                return None
        train_seconds = time.perf_counter() - started
        return self.test(stopped_early, self.samples_trained / max(train_seconds, 1e-9))

    def test(self, stopped_early: bool, samples_per_second: float) -> dict[str, Any]:
        """Evaluate the best (or last) weights on the test set and return the summary."""
        tested = "last"
        best_epoch = int(self.early_stopping.best_epoch.numpy())
        if self.config.test_on == "best" and int(self.position.numpy()) and best_epoch == int(self.epoch.numpy()):
            tested = f"best (epoch {best_epoch}, the final weights)"  # validated part-way: never saved in best/
        elif self.config.test_on == "best":
            tested = self.checkpointer.load_best(self.trained)
            if tested == "best":
                tested = f"best (epoch {best_epoch})"
        summary: dict[str, Any] = {
            "epochs_run": int(self.epoch.numpy()),
            "steps": int(self.step.numpy()),
            "stopped_early": stopped_early,
            "best_epoch": best_epoch,
            f"best_{self.config.monitor}": self.early_stopping.best_value(),
            "tested_checkpoint": tested,
            **self.evaluate("test"),
            "train_samples_per_s": round(samples_per_second, 1),
        }
        if self.run.stop_reason:
            summary["stop_reason"] = self.run.stop_reason
        self.hook("on_run_end", self.run, summary)
        if self.logger is not None:
            self.logger.close(summary)
        return summary
