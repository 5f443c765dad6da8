"""The training loop: train and validate every epoch, checkpoint, then test.

Managed by the looptpl template: put your own code in model.py, data.py, loss.py, metrics.py
and optim.py.
"""

import math
import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from .callbacks import EarlyStopping, MetricLogger, ProgressBar
from .checkpoint import Checkpointer, ConfigState
from .config import TrainConfig, check_resumable
from .distributed import Runtime
from .errors import TrainingError
from .loss import per_sample_loss
from .metrics import build_metrics
from .model import build_model
from .optim import build_optimizer, build_schedule
from .sampling import distribute_eval, distribute_train, split_size
from .train_step import TrainStep, check_per_sample

SUM = tf.distribute.ReduceOp.SUM
PRECISION_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


class Trainer:
    """Owns the model, the optimizer and the distributed datasets of one run."""

    def __init__(
        self, config: TrainConfig, runtime: Runtime, datasets: tuple[tf.data.Dataset, tf.data.Dataset, tf.data.Dataset]
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.strategy = runtime.strategy
        self.run_dir = Path(config.run_dir)
        self.train_set, val_set, test_set = datasets
        self.train_size = split_size(self.train_set, "train")
        self.updates_per_epoch = -(-self.train_size // config.global_batch_size)  # the last batch may be short
        self.eval_sets = {
            "val": distribute_eval(self.strategy, val_set, "val", config.eval_batch_size),
            "test": distribute_eval(self.strategy, test_set, "test", config.eval_batch_size),
        }

        # Layers built from here on compute in bf16/fp16 (under those --precision values) and keep
        # float32 weights.
        keras.mixed_precision.set_dtype_policy(PRECISION_POLICIES[config.precision])
        # Everything that holds variables is created under the strategy's scope, which places each
        # variable (one copy per replica, kept in sync) and ties it to the strategy.
        with self.strategy.scope():
            self.model = build_model(config)
            schedule = build_schedule(config, self.updates_per_epoch * config.epochs)
            self.optimizer = build_optimizer(config, schedule)
            if config.precision == "fp16":
                # fp16 gradients can underflow: the loss is scaled up before backprop; an update with
                # inf/NaN gradients is skipped and the scale lowered.
                self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
            self.optimizer.build(self.model.trainable_variables)  # its state must exist before a restore
            self.eval_loss = keras.metrics.Mean(name="loss")
            self.eval_metrics = build_metrics()
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)  # epochs completed
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False)  # optimizer updates applied
            self.train_step = TrainStep(config, runtime, self.model, self.optimizer, (self.epoch, self.step))
            self.early_stopping = EarlyStopping(config.monitor_mode, config.early_stop_patience)
            self.saved_config = ConfigState(config)
            self.checkpointer = Checkpointer(
                self.run_dir,
                config.keep_checkpoints,
                model=self.model,
                optimizer=self.optimizer,
                epoch=self.epoch,
                step=self.step,
                early_stopping=self.early_stopping,
                config=self.saved_config,
            )
        self.logger = MetricLogger(self.run_dir) if runtime.is_chief else None
        self.progress = ProgressBar(config.progress and runtime.is_chief)

        # The evaluation steps are traced once each, like the train step (train_step.py).
        self.distributed_val_step = tf.function(
            self._distributed_eval_step, input_signature=[self.eval_sets["val"].element_spec]
        )
        self.distributed_test_step = tf.function(
            self._distributed_eval_step, input_signature=[self.eval_sets["test"].element_spec]
        )

    def _distributed_eval_step(self, batch: Any) -> tf.Tensor:
        """Update the metrics with one evaluation batch per replica; returns its number of samples."""
        samples = self.strategy.run(self.eval_step, args=(batch,))
        return self.strategy.reduce(SUM, samples, axis=None)

    def eval_step(self, batch: Any) -> tf.Tensor:
        inputs, targets = batch

        def update_metrics() -> None:
            outputs = self.model(inputs, training=False)
            self.eval_loss.update_state(check_per_sample(per_sample_loss(outputs, targets)))
            for metric in self.eval_metrics.values():
                metric.update_state(targets, outputs)

        # An empty batch (a replica left without samples at the end) adds nothing, so the model is
        # not run on it: some kernels mishandle empty batches (train_step.py says more).
        tf.cond(tf.shape(targets)[0] > 0, update_metrics, lambda: None)
        return tf.shape(targets)[0]

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One pass over the training set; returns the mean training loss (and the skipped updates)."""
        self.progress.start(epoch + 1, self.config.epochs, self.updates_per_epoch)
        # Summed over the epoch and since the last check: loss, samples of applied updates, all
        # samples, skipped updates (train_step.py).
        epoch_totals = window = tf.zeros([4], tf.float64)
        batches = iter(distribute_train(self.strategy, self.train_set, self.config, epoch))
        updates, log_every = 0, self.config.log_every
        while updates < self.updates_per_epoch:
            count = min(self.config.steps_per_call, self.updates_per_epoch - updates)
            try:
                totals = self.train_step.call(batches, tf.constant(count))
            except tf.errors.OutOfRangeError:
                raise TrainingError(
                    f"the train set ran out after {updates} of {self.updates_per_epoch} updates this epoch; "
                    "data.py must give the same samples every epoch"
                ) from None
            epoch_totals, window = epoch_totals + totals, window + totals
            updates += count
            # Progress and the NaN check at the end of each call that passes a multiple of --log-every.
            if updates // log_every > (updates - count) // log_every or updates == self.updates_per_epoch:
                if self.train_step.gave_up():
                    raise TrainingError(self._not_finite_message(epoch))
                loss_sum, kept, _, _ = window.numpy()
                self.progress.update(updates, int(epoch_totals[2]), loss_sum / max(1.0, kept))
                window = tf.zeros([4], tf.float64)
        self.progress.finish()
        loss_sum, kept, samples, skipped = epoch_totals.numpy()
        if samples != self.train_size:
            raise TrainingError(f"trained on {samples:.0f} samples this epoch, expected {self.train_size}")
        result = {"train_loss": loss_sum / kept if kept else math.nan}
        if self.config.nan_policy == "skip":
            result["skipped_updates"] = int(skipped)
        return result

    def _not_finite_message(self, epoch: int) -> str:
        """Why the run stops: the NaN/inf update that --nan-policy stop refuses, or too many skipped in a row."""
        where, advice = f"epoch {epoch + 1}, step {int(self.step.numpy())}", "lower --lr, check your data for NaN/inf"
        if self.config.nan_policy == "skip":
            skips = self.config.max_consecutive_skips + 1
            return (
                f"the loss or gradients were NaN/inf for {skips} updates in a row ({where}); the weights have "
                f"diverged: {advice}, or use --precision fp32"
            )
        loss = float(self.train_step.skipped_loss.numpy())
        problem = f"training loss is {loss}"
        if math.isfinite(loss):  # the loss was fine, its gradients were not
            problem = f"the gradients are NaN/inf (training loss {loss:.4g})"
        return f"{problem} at {where}; {advice}, or use --precision fp32"

    def _check_finite(self, name: str, value: float, epoch: int) -> None:
        if not math.isfinite(value):
            raise TrainingError(
                f"{name} is {value} at epoch {epoch + 1}, step {int(self.step.numpy())}; lower --lr, check your data "
                "for NaN/inf, or use --precision fp32"
            )

    def evaluate(self, split: str) -> dict[str, float]:
        """Mean loss and metrics over every sample of `split` ("val" or "test"), each counted once."""
        metrics = {"loss": self.eval_loss, **self.eval_metrics}
        for metric in metrics.values():
            metric.reset_state()
        step = self.distributed_val_step if split == "val" else self.distributed_test_step
        samples = 0
        for batch in self.eval_sets[split]:
            samples += int(step(batch))
        # Each replica updated its own copy of every metric with its own samples; result() first
        # sums the copies over all replicas (an all-reduce), so each sample counts once.
        results = {f"{split}_{name}": float(metric.result()) for name, metric in metrics.items()}
        results[f"{split}_samples"] = samples
        return results

    def resume(self) -> None:
        """Continue from the latest checkpoint in the run directory."""
        self.checkpointer.restore_latest()
        check_resumable(self.config, self.saved_config.saved)
        if self.logger is not None:
            self.logger.keep_until(int(self.epoch.numpy()))
            print(f"resumed from epoch {int(self.epoch.numpy())}, step {int(self.step.numpy())}", flush=True)

    def fit(self) -> dict[str, Any] | None:
        """Train until --epochs or early stopping, then test and return the summary.

        Returns None when --stop-after-epoch ends the run early: it is unfinished, not tested.
        """
        started, samples_trained = time.perf_counter(), 0
        stopped_early = False
        for epoch in range(int(self.epoch.numpy()), self.config.epochs):
            epoch_started = time.perf_counter()
            record: dict[str, Any] = {"epoch": epoch + 1, **self.train_epoch(epoch), **self.evaluate("val")}
            samples_trained += self.train_size
            record.update(step=int(self.step.numpy()), lr=float(self.optimizer.learning_rate))
            record["epoch_time_s"] = round(time.perf_counter() - epoch_started, 3)
            if self.config.monitor not in record:
                raise TrainingError(
                    f"--monitor {self.config.monitor} is not a logged metric; choose one of "
                    + ", ".join(name for name in record if name.startswith(("train_", "val_")))
                )
            self._check_finite("validation loss", record["val_loss"], epoch)  # never checkpoint NaN weights
            is_best = self.early_stopping.update(record[self.config.monitor], epoch + 1)
            self.epoch.assign(epoch + 1)
            if self.logger is not None:
                self.logger.log(record)
            self.checkpointer.save(epoch + 1, is_best)
            if self.runtime.agree(self.early_stopping.should_stop):
                stopped_early = True
                break
            if epoch + 1 == self.config.stop_after_epoch:
                return None
        train_seconds = time.perf_counter() - started
        return self.test(stopped_early, samples_trained / max(train_seconds, 1e-9))

    def test(self, stopped_early: bool, samples_per_second: float) -> dict[str, Any]:
        """Evaluate the best (or last) weights on the test set and return the summary."""
        tested = "last"
        if self.config.test_on == "best" and self.checkpointer.restore_best_weights(self.model):
            tested = f"best (epoch {int(self.early_stopping.best_epoch.numpy())})"
        summary: dict[str, Any] = {
            "epochs_run": int(self.epoch.numpy()),
            "steps": int(self.step.numpy()),
            "stopped_early": stopped_early,
            "best_epoch": int(self.early_stopping.best_epoch.numpy()),
            f"best_{self.config.monitor}": self.early_stopping.best_value(),
            "tested_checkpoint": tested,
            **self.evaluate("test"),
            "train_samples_per_s": round(samples_per_second, 1),
        }
        if self.logger is not None:
            self.logger.close()
        return summary
