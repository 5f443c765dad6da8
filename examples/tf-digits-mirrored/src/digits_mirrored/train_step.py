"""The optimizer updates, compiled: loss scaling, all-reduce, clipping and the NaN policy.

Managed by the looptpl template: put your own code in model.py, loss.py and optim.py. engine.py
calls a TrainStep for --steps-per-call updates at a time; everything here runs inside one
tf.function.
"""

import sys
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from .config import TrainConfig
from .distributed import Runtime
from .errors import DataError
from .loss import per_sample_loss

SUM = tf.distribute.ReduceOp.SUM


class TrainStep:
    """Applies updates; `call(batches, count)` returns their summed [loss, samples kept, samples, skipped].

    "Kept" counts the samples of applied updates: a skipped update's loss is left out of train_loss.
    Build it under `strategy.scope()`: its counters are variables kept alike on every replica.
    """

    def __init__(
        self,
        config: TrainConfig,
        runtime: Runtime,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        counters: tuple[tf.Variable, tf.Variable],
    ) -> None:
        self.config = config
        self.strategy = runtime.strategy
        self.model = model
        self.optimizer = optimizer
        self.epoch, self.step = counters  # epochs completed, optimizer updates applied
        self.replicas = self.strategy.num_replicas_in_sync
        self.micro_batch_size = config.check_batch_split(self.replicas)
        # --nan-policy stop allows no skipped update: the first one stops the run.
        self.allowed_skips = config.max_consecutive_skips if config.nan_policy == "skip" else 0
        self.warn_on_skip = config.nan_policy == "skip" and runtime.is_chief
        self.skips_in_a_row = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.skipped_loss = tf.Variable(0.0, dtype=tf.float64, trainable=False)  # of the last skipped update
        # Traced once: every epoch's iterator has the same element spec, which fixes every dimension
        # but the batch size, so the short last batch (or a replica whose batch is empty) runs the
        # same graph, not a retrace.
        self.call = tf.function(self._updates)

    def gave_up(self) -> bool:
        """Whether more updates in a row were skipped than the NaN policy allows."""
        return int(self.skips_in_a_row.numpy()) > self.allowed_skips

    def _updates(self, batches: Iterator, count: tf.Tensor) -> tf.Tensor:
        """`count` updates, one per global batch taken from `batches`, in a loop inside the graph.

        Python runs once per call, not once per update: for a small model, per-update Python
        overhead would cost as much as the update itself.
        """
        totals = tf.zeros([4], tf.float64)
        for _ in tf.range(count):
            totals += self._update(next(batches))
        return totals

    def _update(self, batch: Any) -> tf.Tensor:
        """One update on one global batch; returns its [loss, samples kept, samples, skipped]."""
        grads, loss_sum, samples, finite = self.strategy.run(self.compute_gradients, args=(batch,))
        loss_sum = self.strategy.reduce(SUM, loss_sum, axis=None)
        samples = self.strategy.reduce(SUM, samples, axis=None)
        # Each replica computed `finite` from the same all-reduced sums, so they all agree.
        finite = self.strategy.experimental_local_results(finite)[0]
        # An update with a NaN/inf loss or gradient is skipped on every replica alike: the weights,
        # the optimizer state, the step counter and so the schedule stay as they were. Once more
        # updates in a row are skipped than allowed, nothing is applied any more and the engine
        # stops the run.
        apply = finite & (self.skips_in_a_row <= self.allowed_skips)
        # The cond is taken here, outside strategy.run: apply_gradients calls into the cross-replica
        # context, which TensorFlow does not allow from a cond taken inside a replica.
        tf.cond(
            apply,
            lambda: self.strategy.run(self.apply_gradients, args=(grads,)),
            lambda: self._skip(loss_sum / tf.maximum(samples, 1.0)),
        )
        self.step.assign_add(tf.cast(apply, tf.int64))
        self.skips_in_a_row.assign(tf.where(apply, tf.zeros_like(self.skips_in_a_row), self.skips_in_a_row + 1))
        kept = tf.cast(apply, tf.float64)
        return tf.stack([tf.where(apply, loss_sum, tf.zeros_like(loss_sum)), kept * samples, samples, 1.0 - kept])

    def _skip(self, loss: tf.Tensor) -> None:
        self.skipped_loss.assign(loss)
        if self.warn_on_skip:
            # Warn for each skip the policy allows and for the one that ends the run, not after it.
            tf.cond(self.skips_in_a_row <= self.allowed_skips, lambda: self._warn(loss), lambda: None)

    def _warn(self, loss: tf.Tensor) -> None:
        message = "warning: NaN/inf loss or gradients at epoch {}, step {}: update skipped (training loss {})"
        where = (self.epoch + 1, self.step, tf.cast(loss, tf.float32))
        tf.print(tf.strings.format(message, where), output_stream=sys.stderr)

    def compute_gradients(self, batch: Any) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]:
        """One replica's part: its micro-batches forward and backward, then the clipped global gradient.

        Also returns the replica's summed loss and sample count, and whether the update is finite.
        """
        _, targets = batch
        samples = tf.cast(tf.shape(targets)[0], tf.float32)
        # N, the samples in this global batch over all replicas: fewer than --global-batch-size in
        # the last batch of an epoch, where some replicas may get no samples at all.
        context = tf.distribute.get_replica_context()
        global_samples = context.all_reduce(SUM, samples)
        grads = [tf.zeros(variable.shape, variable.dtype) for variable in self.model.trainable_variables]
        loss_sum = tf.constant(0.0, tf.float64)
        for micro_step in tf.range(self.config.grad_accum_steps):
            # One micro-batch at a time: accumulation is there to bound memory, so no overlap.
            tf.autograph.experimental.set_loop_options(parallel_iterations=1)
            micro_batch = _rows(batch, micro_step * self.micro_batch_size, self.micro_batch_size)
            micro_grads, micro_loss_sum = self._micro_step(micro_batch, global_samples)
            grads = [total + grad for total, grad in zip(grads, micro_grads, strict=True)]
            loss_sum += micro_loss_sum
        # One all-reduce sums the replicas' shares into the global gradient, and their losses along
        # with it (in float32, only to see whether any replica's loss is NaN/inf).
        *grads, global_loss = context.all_reduce(SUM, [*grads, tf.cast(loss_sum, grads[0].dtype)])
        norm = tf.linalg.global_norm(grads)
        finite = tf.math.is_finite(global_loss)
        if self.config.precision != "fp16":
            # (Under fp16, inf gradients mean the loss scale overflowed: the LossScaleOptimizer skips
            # such an update itself and lowers the scale.)
            finite &= tf.math.is_finite(norm)
        if self.config.max_grad_norm > 0:
            # Under fp16 the gradients still carry the loss scale S (the LossScaleOptimizer divides
            # it out): clipping S*g at S*max_norm is clipping g at max_norm.
            loss_scale = self.optimizer.scale_loss(1.0)
            grads, _ = tf.clip_by_global_norm(grads, self.config.max_grad_norm * loss_scale, use_norm=norm)
        return grads, loss_sum, tf.cast(samples, tf.float64), finite

    def _micro_step(self, micro_batch: Any, global_samples: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor]:
        """Gradients and summed loss of one micro-batch."""
        inputs, targets = micro_batch
        variables = self.model.trainable_variables
        # Regularization losses depend only on the weights, which every replica and micro-step
        # shares: each adds 1/(R*A) of them.
        regularization_share = 1.0 / (self.replicas * self.config.grad_accum_steps)

        def with_samples() -> tuple[tf.Tensor, tf.Tensor]:
            losses = check_per_sample(per_sample_loss(self.model(inputs, training=True), targets))
            # The update must follow the gradient of the mean loss over the N samples of the global
            # batch, (1/N) * sum_i grad(l_i) over every replica and micro-step. Each replica adds
            # sum(l_i) / N for the samples of each micro-step, and the all-reduce sums the replicas:
            # exactly that mean, for any number of replicas R and micro-steps A. N is counted in
            # every update, so the short last batch is averaged over its true size
            # (tf.nn.compute_average_loss with the constant --global-batch-size would shrink it).
            loss = tf.reduce_sum(losses) / global_samples
            loss += sum(self.model.losses, tf.constant(0.0)) * regularization_share
            return loss, tf.reduce_sum(tf.cast(losses, tf.float64))

        def without_samples() -> tuple[tf.Tensor, tf.Tensor]:
            # An empty micro-batch (the end of an epoch can leave a replica none) adds nothing to
            # the loss, so the model is not run on it: some kernels mishandle empty batches
            # (oneDNN's Conv2D inside a tf.function returns the wrong shape). Its share of the
            # weight regularization still counts.
            penalties = [variable.regularizer(variable) for variable in variables if variable.regularizer]
            return sum(penalties, tf.constant(0.0)) * regularization_share, tf.constant(0.0, tf.float64)

        with tf.GradientTape() as tape:
            loss, loss_sum = tf.cond(tf.shape(targets)[0] > 0, with_samples, without_samples)
            scaled_loss = self.optimizer.scale_loss(loss)  # times the fp16 loss scale; else unchanged
        grads = tape.gradient(scaled_loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return grads, loss_sum

    def apply_gradients(self, grads: list[tf.Tensor]) -> None:
        """Update the weights with the clipped global gradient (on every replica)."""
        # Keras' apply_gradients sums the gradients over the replicas once more and cannot be told
        # not to. Ours are already summed and clipped, so replica 0 hands them over and the others
        # zeros: Keras' sum is then exactly ours. (Keras' own global_clipnorm would clip each
        # replica's share before that sum; clipping the true gradient costs this second all-reduce.)
        is_first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
        grads = [tf.where(is_first, grad, tf.zeros_like(grad)) for grad in grads]
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))


def _rows(batch: Any, start: tf.Tensor, size: int) -> Any:
    """Rows [start, start + size) of every tensor in `batch`: fewer, or none, past its end."""
    return tf.nest.map_structure(lambda tensor: tensor[start : start + size], batch)


def check_per_sample(losses: tf.Tensor) -> tf.Tensor:
    """Check, while tracing, that loss.py gave one value per sample (a mean would silently mis-scale)."""
    if losses.shape.rank != 1:
        raise DataError(
            f"loss.py must return one value per sample, shape [batch], got shape {losses.shape}; "
            "do not average over the batch"
        )
    return losses
