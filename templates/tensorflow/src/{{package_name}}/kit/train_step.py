"""The optimizer updates, compiled: loss scaling, the sum over replicas, clipping and the NaN policy.

Managed by the looptpl template: put your own code in step.py and optim.py. engine.py calls a
TrainStep for --steps-per-call updates at a time; everything here runs inside one tf.function.
"""

import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from ..distributed import Runtime
from ..step import train_step
from .collect import Mean, check_train_value, run_updates_in_a_loop
from .config import TrainConfig
from .errors import StepError, user_code_error
from .profiling import CallProfiler
from .sampling import part, rows
from .stages import Stage
from .xla import compile_micro_step, xla_error

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
        # position of the last global batch trained on (sampling.py; None for a map-style one).
        self.epoch, self.step, self.stream_position = counters
        config.check_batch_split(self.replicas)  # full batches split into equal micro-batches
        # --nan-policy stop allows no skipped update: the first one stops the run.
        self.allowed_skips = config.max_consecutive_skips if config.nan_policy == "skip" else 0
        self.warn_on_skip = config.nan_policy == "skip" and runtime.is_main
        # Traced once: every epoch's iterator has the same element spec, which fixes every dimension
        # but the batch size, so the short last batch runs the same graph, not a retrace (with several
        # workers, a retrace on one alone would also leave the workers' collectives out of step).
        self.compiled = tf.function(self._updates)
        # --jit-compile: XLA compiles each micro-step whole, forward and backward (xla.py).
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

    def updates_in_next_call(self, updates: int, in_run: int, end: int) -> int:
        """How many updates the next call runs, from update `updates` of the epoch (`in_run` of the run).

        A call ends at the epoch's `end` and at every update that logs, checkpoints or validates, so
        --steps-per-call and a resume change neither the logs nor the checkpoints.
        """
        config = self.config
        due = [config.steps_per_call, end - updates, config.log_every - updates % config.log_every]
        if config.stop_after_step > in_run:
            due.append(config.stop_after_step - in_run)
        for every in (config.checkpoint_every, config.eval_every):
            if every:
                due.append(every - in_run % every)
        return min(due)

    def gave_up(self) -> Stage | None:
        """The stage that skipped more updates in a row than the NaN policy allows, if any."""
        return next((stage for stage in self.stages if int(stage.skips_in_a_row.numpy()) > self.allowed_skips), None)

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
        # Near-equal micro-batches, each with at least one sample (sampling.py keeps a short last
        # batch only then): a short batch is spread evenly, not left to the last micro-step.
        parts = self.config.grad_accum_steps
        micro_batches = [part(batch, index, parts) for index in range(parts)]
        # A micro-batch's step runs up to its first loss. With several optimizers, step.py yields one
        # loss per stage and is resumed stage by stage, after the previous stage's update.
        # Under --jit-compile (one optimizer) each micro-step runs whole, compiled by XLA.
        steps = [] if self.jit_micro_step else [self._losses(micro_batch) for micro_batch in micro_batches]
        sums, applied = [], []
        for stage in self.stages:
            if self.jit_micro_step:
                micro_steps = [functools.partial(self.jit_micro_step, micro_batch) for micro_batch in micro_batches]
            else:
                micro_steps = [functools.partial(self._micro_step, stage, losses) for losses in steps]
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
        for losses in steps:
            self._check_no_more_losses(losses)
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

    def _micro_step(self, stage: Stage, losses: Iterator[tuple[str, Mean]]) -> MicroStep:
        """The stage's part of one micro-step: step.py runs up to the stage's loss, then its gradients."""
        with tf.GradientTape() as tape:
            loss = self._next_loss(losses, stage)
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
        losses = self._losses(micro_batch)
        result = self._micro_step(self.stages[0], losses)
        self._check_no_more_losses(losses)
        return result

    def _check_no_more_losses(self, losses: Iterator[tuple[str, Mean]]) -> None:
        if next(losses, None) is not None:
            raise StepError(f"train_step yielded more losses than optim.py has optimizers ({len(self.stages)})")

    def _losses(self, micro_batch: Any) -> Iterator[tuple[str, Mean]]:
        """step.py's losses for one micro-batch, one per stage; nothing runs before the first is asked for."""
        result = train_step(self.models, micro_batch, self.config)
        if isinstance(result, Iterator):
            yield from result
        else:
            yield self.stages[0].name, result

    def _next_loss(self, losses: Iterator[tuple[str, Mean]], stage: Stage) -> Mean:
        try:
            given = next(losses)
        except StopIteration:
            raise StepError(f"train_step yielded no loss for optimizer {stage.name!r} of optim.py") from None
        except Exception as error:
            raise user_code_error(error, "in train_step") from None
        if not (isinstance(given, tuple) and len(given) == 2) or (len(self.stages) > 1 and given[0] != stage.name):
            names = [stage.name for stage in self.stages]
            raise StepError(f"train_step must yield (name, Mean) pairs for the optimizers {names}, in that order")
        return check_train_value(given[1], stage.name)

    def _apply_or_skip(
        self, stage: Stage, strategy: tf.distribute.Strategy, grads: Any, finite: Any, loss: Any, norm: Any
    ) -> tf.Tensor:
        """Apply the stage's update on every replica, or skip it; runs once, in the cross-replica context.

        An update with a NaN/inf loss or gradient is skipped on every replica alike: the weights, the
        optimizer state and so the schedule stay as they were. Once more updates in a row are skipped
        than allowed, nothing is applied any more and the engine stops the run.
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
        """Update the stage's weights with its clipped global gradient (on every replica)."""
        if self.replicas > 1:
            # Keras' apply_gradients sums the gradients over the replicas once more and cannot be told
            # not to. Ours are already summed and clipped, so replica 0 hands them over and the others
            # zeros: Keras' sum is then exactly ours. (Keras' own global_clipnorm would clip each
            # replica's share before that sum; clipping the true gradient costs this second all-reduce.)
            is_first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
            grads = [tf.where(is_first, grad, tf.zeros_like(grad)) for grad in grads]
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
