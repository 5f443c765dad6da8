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
from .errors import DataError, TrainingError
from .loss import per_sample_loss
from .metrics import build_metrics
from .model import build_model
from .optim import build_optimizer, build_schedule
from .sampling import distribute_eval, distribute_train, split_size

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
        self.replicas = self.strategy.num_replicas_in_sync
        self.micro_batch_size = config.check_batch_split(self.replicas)
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
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False)  # optimizer updates done
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

        # Each step is traced once: the signature fixes every dimension but the batch size, so the
        # short last batch (or a replica whose batch is empty) runs the same graph, not a retrace.
        train_spec = distribute_train(self.strategy, self.train_set, config, epoch=0).element_spec
        self.distributed_train_step = tf.function(self._distributed_train_step, input_signature=[train_spec])
        self.distributed_val_step = tf.function(
            self._distributed_eval_step, input_signature=[self.eval_sets["val"].element_spec]
        )
        self.distributed_test_step = tf.function(
            self._distributed_eval_step, input_signature=[self.eval_sets["test"].element_spec]
        )

    def _distributed_train_step(self, batch: Any) -> tf.Tensor:
        """One optimizer update; returns the global batch's summed loss and its number of samples."""
        loss_sum, samples = self.strategy.run(self.train_step, args=(batch,))
        self.step.assign_add(1)
        return tf.stack([self.strategy.reduce(SUM, loss_sum, axis=None), self.strategy.reduce(SUM, samples, axis=None)])

    def train_step(self, batch: Any) -> tuple[tf.Tensor, tf.Tensor]:
        """One update as one replica sees it: its micro-batches forward and backward, then apply."""
        _, targets = batch
        samples = tf.cast(tf.shape(targets)[0], tf.float32)
        # N, the samples in this global batch over all replicas: fewer than --global-batch-size in
        # the last batch of an epoch, where some replicas may get no samples at all.
        global_samples = tf.distribute.get_replica_context().all_reduce(SUM, samples)
        variables = self.model.trainable_variables
        grads = [tf.zeros(variable.shape, variable.dtype) for variable in variables]
        loss_sum = tf.constant(0.0, tf.float64)
        for micro_step in tf.range(self.config.grad_accum_steps):
            # One micro-batch at a time: accumulation is there to bound memory, so no overlap.
            tf.autograph.experimental.set_loop_options(parallel_iterations=1)
            micro_inputs, micro_targets = _rows(batch, micro_step * self.micro_batch_size, self.micro_batch_size)
            with tf.GradientTape() as tape:
                losses = _per_sample(per_sample_loss(self.model(micro_inputs, training=True), micro_targets))
                # The update must follow the gradient of the mean loss over the N samples of the
                # global batch, (1/N) * sum_i grad(l_i) over every replica and micro-step. Each
                # replica adds sum(l_i) / N for the samples of each micro-step, and the all-reduce
                # in _apply_gradients sums the replicas: exactly that mean, for any number of
                # replicas R and micro-steps A. N is counted in every update, so the short last
                # batch is averaged over its true size (tf.nn.compute_average_loss with the constant
                # --global-batch-size would shrink it). Regularization losses depend only on the
                # weights, which every replica and micro-step shares: each adds 1/(R*A) of them.
                loss = tf.reduce_sum(losses) / global_samples
                if self.model.losses:
                    loss += tf.add_n(self.model.losses) / (self.replicas * self.config.grad_accum_steps)
                scaled_loss = self.optimizer.scale_loss(loss)  # times the fp16 loss scale; else unchanged
            micro_grads = tape.gradient(scaled_loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            grads = [total + grad for total, grad in zip(grads, micro_grads, strict=True)]
            loss_sum += tf.reduce_sum(tf.cast(losses, tf.float64))
        self._apply_gradients(grads)
        return loss_sum, tf.cast(samples, tf.float64)

    def _apply_gradients(self, grads: list[tf.Tensor]) -> None:
        """Clip the global batch's gradient and update the weights (on every replica)."""
        context = tf.distribute.get_replica_context()
        grads = context.all_reduce(SUM, grads)  # the replicas' shares add up to the global gradient
        if self.config.max_grad_norm > 0:
            # Under fp16 the gradients still carry the loss scale S (the LossScaleOptimizer divides
            # it out): clipping S*g at S*max_norm is clipping g at max_norm.
            loss_scale = self.optimizer.scale_loss(1.0)
            grads, _ = tf.clip_by_global_norm(grads, self.config.max_grad_norm * loss_scale)
        # Keras' apply_gradients sums the gradients over the replicas once more and cannot be told
        # not to. Ours are already summed and clipped, so replica 0 hands them over and the others
        # zeros: Keras' sum is then exactly ours. (Keras' own global_clipnorm would clip each
        # replica's share before that sum; clipping the true gradient costs this second all-reduce.)
        is_first = tf.equal(context.replica_id_in_sync_group, 0)
        grads = [tf.where(is_first, grad, tf.zeros_like(grad)) for grad in grads]
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))

    def _distributed_eval_step(self, batch: Any) -> tf.Tensor:
        """Update the metrics with one evaluation batch per replica; returns its number of samples."""
        samples = self.strategy.run(self.eval_step, args=(batch,))
        return self.strategy.reduce(SUM, samples, axis=None)

    def eval_step(self, batch: Any) -> tf.Tensor:
        inputs, targets = batch
        outputs = self.model(inputs, training=False)
        self.eval_loss.update_state(_per_sample(per_sample_loss(outputs, targets)))
        for metric in self.eval_metrics.values():
            metric.update_state(targets, outputs)
        return tf.shape(targets)[0]

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One pass over the training set; returns the mean training loss over its samples."""
        self.progress.start(epoch + 1, self.config.epochs, self.updates_per_epoch)
        epoch_totals = window = tf.zeros([2], tf.float64)  # summed loss, samples
        updates = 0
        for updates, batch in enumerate(distribute_train(self.strategy, self.train_set, self.config, epoch), 1):
            totals = self.distributed_train_step(batch)
            epoch_totals, window = epoch_totals + totals, window + totals
            if updates % self.config.log_every == 0 or updates == self.updates_per_epoch:
                loss_sum, samples = window.numpy()
                loss = loss_sum / max(1.0, samples)
                self._check_finite("training loss", loss, epoch)
                self.progress.update(updates, int(epoch_totals[1]), loss)
                window = tf.zeros([2], tf.float64)
        self.progress.finish()
        loss_sum, samples = epoch_totals.numpy()
        if updates != self.updates_per_epoch or samples != self.train_size:
            raise TrainingError(
                f"trained on {samples:.0f} samples in {updates} updates this epoch, "
                f"expected {self.train_size} in {self.updates_per_epoch}"
            )
        return {"train_loss": loss_sum / samples}

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


def _rows(batch: Any, start: tf.Tensor, size: int) -> Any:
    """Rows [start, start + size) of every tensor in `batch`: fewer, or none, past its end."""
    return tf.nest.map_structure(lambda tensor: tensor[start : start + size], batch)


def _per_sample(losses: tf.Tensor) -> tf.Tensor:
    """Check, while tracing, that loss.py gave one value per sample (a mean would silently mis-scale)."""
    if losses.shape.rank != 1:
        raise DataError(
            f"loss.py must return one value per sample, shape [batch], got shape {losses.shape}; "
            "do not average over the batch"
        )
    return losses
