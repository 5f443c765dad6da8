"""What step.py returns, and how the loop averages it. Managed by the looptpl template.

A step returns values and says how much each one counts; the loop does the averaging, over
the whole global batch (every replica, every accumulation micro-step) in training and over
every sample of a split in evaluation. Returning the average of a micro-batch instead would
weigh a short or sparse micro-batch like a full one: the classic gradient-accumulation bug.

Everything here runs inside the loop's tf.function, once per replica.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import tensorflow as tf

from .errors import StepError

SUM = tf.distribute.ReduceOp.SUM

# Whether the loop runs several updates in one tf.function call (--steps-per-call above 1); set
# by train.py's TrainStep before it traces.
_updates_in_a_loop = False


def run_updates_in_a_loop(several: bool) -> None:
    """Tell gather_with_grad whether one tf.function call runs several updates in a graph loop."""
    global _updates_in_a_loop
    _updates_in_a_loop = several


@dataclass(init=False)
class Mean:
    """Values to average, each counting `weights` times: `sum(values * weights) / sum(weights)`.

    `Mean(per_sample_losses)` is the mean over samples; `Mean(token_losses, weights=mask)` the mean
    over the real (unmasked) tokens of the global batch; `per` names what one unit of weight is,
    and the logs count those units (`val_tokens`).
    """

    total: tf.Tensor  # sum(values * weights), a float32 scalar
    weight: tf.Tensor  # sum(weights), a float32 scalar
    per: str
    dtype: tf.DType  # of the values as given: a loss must be floating point to have a gradient

    def __init__(self, values: tf.Tensor, weights: tf.Tensor | None = None, per: str = "sample") -> None:
        if not tf.is_tensor(values) or values.shape.rank in (0, None):
            raise StepError(
                f"Mean() takes one value per sample (or per token), got {_describe(values)}; do not average "
                "over the batch: the loop averages over the whole global batch"
            )
        self.dtype = values.dtype
        values = tf.cast(values, tf.float32)  # bf16/fp16 outputs are summed in float32
        if weights is None:
            self.total, self.weight = tf.reduce_sum(values), tf.cast(tf.size(values), tf.float32)
        else:
            if not tf.is_tensor(weights) or not weights.shape.is_compatible_with(values.shape):
                raise StepError(
                    f"Mean(values, weights): weights must have the shape of values, {values.shape.as_list()}, "
                    f"got {_describe(weights)}"
                )
            weights = tf.stop_gradient(tf.cast(weights, tf.float32))
            self.total, self.weight = tf.reduce_sum(values * weights), tf.reduce_sum(weights)
        self.per = per


@dataclass
class Gather:
    """Per-sample rows (first dimension: samples) that evaluation collects over the whole split.

    For metrics that are not a mean over samples (F1, AUC, a confusion matrix): metrics.py's
    `dataset_metrics` receives every sample's row exactly once, from all replicas, in dataset order.
    """

    rows: tf.Tensor


def evaluation(loss: Mean, metrics: dict[str, Mean | Gather]) -> dict[str, Mean | Gather]:
    """The loss and the metrics of an evaluation batch in one dict; a metric may not be named `loss`."""
    if "loss" in metrics:
        raise StepError("metrics.py returns a metric named 'loss', which would replace the loss; rename the metric")
    return {"loss": loss, **metrics}


def gather_with_grad(tensor: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`tensor`'s rows from every replica, in replica order, with gradients passed back; and where this replica's start.

    For objectives that couple the samples of the global batch (CLIP, SimCLR): each replica's loss
    then sees every replica's embeddings as negatives, and the gradient of each embedding flows
    back to the replica that computed it, so N replicas train exactly like one. Replicas may hold
    different numbers of rows (the short last batch). Every replica must call it. With
    accumulation it gathers one micro-batch per replica: the negatives are those of the
    micro-step, not of the whole global batch (see docs/semantics.md).
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return tensor, tf.constant(0)
    if _updates_in_a_loop:
        # In the graph loop of several updates, one replica may start the next update's gather while
        # another still runs this one's, and TensorFlow pairs collectives by position, not by update.
        raise StepError(
            "gather_with_grad needs one update per call on several replicas: run with --steps-per-call 1 "
            '(or DEFAULTS = {"steps_per_call": 1} in settings.py)'
        )
    replicas, me, rows = context.num_replicas_in_sync, context.replica_id_in_sync_group, tf.shape(tensor)[0]
    counts = tf.cast(context.all_reduce(SUM, tf.one_hot(me, replicas) * tf.cast(rows, tf.float32)), tf.int32)
    start, total = tf.reduce_sum(counts[:me]), tf.reduce_sum(counts)

    # Each replica places its rows at their offset in zeros and one all-reduce sums them: x + 0 is
    # exact, so that is the concatenation. (ReplicaContext.all_gather does the same in one op, but its
    # collectives can pair up out of order with the loop's own on the CPU.)
    @tf.custom_gradient
    def gather(local: tf.Tensor) -> tuple[tf.Tensor, object]:
        padding = [[start, total - start - rows]] + [[0, 0]] * (local.shape.rank - 1)
        everyone = context.all_reduce(SUM, tf.pad(local, padding))

        def back(upstream: tf.Tensor) -> tf.Tensor:
            # Every replica's loss may depend on these rows: sum their gradients, keep this replica's rows.
            return context.all_reduce(SUM, upstream)[start : start + rows]

        return everyone, back

    return gather(tensor), start


def check_train_value(value: object, stage: str) -> Mean:
    """The loss a training step gave for `stage`: a Mean of floating point values."""
    if not isinstance(value, Mean):
        raise StepError(f"train_step must return a Mean for {stage!r}, got {_describe(value)}; wrap the loss in Mean()")
    if not value.dtype.is_floating:
        raise StepError(
            f"the {stage!r} loss from train_step is {value.dtype.name}, which has no gradient; return a floating "
            "point loss (a cross-entropy, say), not a count or a comparison"
        )
    return value


def check_eval_values(values: object) -> dict[str, Mean | Gather]:
    """What eval_step returned: a dict of Mean and Gather values with names usable in the logs."""
    if not isinstance(values, dict) or not values:
        raise StepError(f"eval_step must return a dict of Mean or Gather values, got {_describe(values)}")
    for name, value in values.items():
        if name == "samples" or not isinstance(name, str):
            raise StepError(f"eval_step returned a value named {name!r}; the logs use that name, choose another")
        if not isinstance(value, Mean | Gather):
            raise StepError(
                f"eval_step (step.py, metrics.py) returned {name!r} as {_describe(value)}; return a Mean or a Gather"
            )
        if isinstance(value, Gather) and (not tf.is_tensor(value.rows) or value.rows.shape.rank in (0, None)):
            raise StepError(f"eval_step's {name!r}: Gather needs per-sample rows, got {_describe(value.rows)}")
    return values


def _describe(value: object) -> str:
    if tf.is_tensor(value):
        return f"a tensor of shape {value.shape}"  # type: ignore[attr-defined]
    if isinstance(value, Iterator):
        return "a generator (yield losses only when optim.py returns several optimizers)"
    return "None" if value is None else f"a {type(value).__name__}"
