"""One optimizer's part of an update: which weights it trains, and its NaN counters.

Managed by the looptpl template: put your own code in step.py and optim.py.

A run has one stage per optimizer (optim.py), in order. With one optimizer there is one stage
and nothing else to know. With several (a GAN's discriminator, then its generator), step.py
yields one loss per stage, and each stage takes the gradients of its own model's weights only.
"""

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import keras
import tensorflow as tf

from .collect import Mean, check_train_value
from .config import TrainConfig
from .ema import keep_average
from .errors import DataError, RunError, StepError, user_code_error


@dataclass
class Stage:
    """An optimizer and the model whose weights it updates. Build it under `strategy.scope()`."""

    name: str
    optimizer: keras.optimizers.Optimizer
    model: keras.Model
    # Updates skipped in a row by --nan-policy skip, the loss of the last one skipped, and the norm
    # of the last update's gradient before clipping.
    skips_in_a_row: tf.Variable = field(init=False)
    skipped_loss: tf.Variable = field(init=False)
    grad_norm: tf.Variable = field(init=False)

    def __post_init__(self) -> None:
        self.skips_in_a_row = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.skipped_loss = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.grad_norm = tf.Variable(0.0, dtype=tf.float32, trainable=False)

    @property
    def variables(self) -> list[tf.Variable]:
        return self.model.trainable_variables

    def penalty(self) -> tf.Tensor | None:
        """What the model's layers add to the loss (Keras' `model.losses`), summed; None if they add nothing.

        Read right after the model's call: Keras then holds the `add_loss()` values of that call,
        activity regularizers among them (each averaged over the samples of the call's batch), and
        computes the weight regularizers' penalties (`kernel_regularizer=`, ...) from the weights.
        """
        penalties = self.model.losses
        return tf.add_n([tf.cast(penalty, tf.float32) for penalty in penalties]) if penalties else None


def split_models(built: object) -> tuple[dict[str, keras.Model], dict[str, keras.Model]]:
    """model.py's network(s) by name, split into those with trainable weights and frozen ones."""
    named: dict[str, object] = built if isinstance(built, dict) else {"model": built}
    for name, model in named.items():
        if not isinstance(model, keras.Model):
            raise DataError(f"model.py: build_model must return a keras.Model or a dict of them; {name!r} is {model!r}")
        if not model.built:
            raise DataError(f"model.py: {name!r} has no weights yet; start it from keras.Input so they exist at once")
    models: dict[str, keras.Model] = named  # type: ignore[assignment]
    trained = {name: model for name, model in models.items() if model.trainable_variables}
    if not trained:
        raise DataError("model.py: build_model returned no trainable weight (every model has trainable=False)")
    return trained, {name: model for name, model in models.items() if name not in trained}


def micro_step_losses(
    train_step: Callable[[Any, Any, TrainConfig], Any], models: Any, batch: Any, config: TrainConfig, first: str
) -> Iterator[tuple[str, Mean]]:
    """step.py's losses for one micro-batch, one per stage: a returned `Mean` is the first stage's,
    a generator yields (name, Mean) pairs. Nothing runs before the first loss is asked for."""
    result = train_step(models, batch, config)
    if isinstance(result, Iterator):
        yield from result
    else:
        yield first, result


def next_loss(losses: Iterator[tuple[str, Mean]], stage: Stage, stages: list[Stage]) -> Mean:
    """The loss that `stage` trains on from a micro-batch's `micro_step_losses`, checked."""
    try:
        given = next(losses)
    except StopIteration:
        raise StepError(f"train_step yielded no loss for optimizer {stage.name!r} of optim.py") from None
    except Exception as error:
        raise user_code_error(error, "in train_step") from None
    if not (isinstance(given, tuple) and len(given) == 2) or (len(stages) > 1 and given[0] != stage.name):
        names = [stage.name for stage in stages]
        raise StepError(f"train_step must yield (name, Mean) pairs for the optimizers {names}, in that order")
    return check_train_value(given[1], stage.name)


def check_all_used(steps: list[Iterator[tuple[str, Mean]]], stages: list[Stage]) -> None:
    """A step that yields more losses than there are optimizers has a loss nothing trains on."""
    for losses in steps:
        if next(losses, None) is not None:
            raise StepError(f"train_step yielded more losses than optim.py has optimizers ({len(stages)})")


def updates_in_next_call(config: TrainConfig, updates: int, in_run: int, end: int) -> int:
    """How many updates the next compiled call runs, from update `updates` of the epoch (`in_run` of the run).

    A call ends at the epoch's `end` and at every update that logs, checkpoints or validates, so
    --steps-per-call and a resume change neither the logs nor the checkpoints.
    """
    due = [config.steps_per_call, end - updates, config.log_every - updates % config.log_every]
    if config.stop_after_step > in_run:
        due.append(config.stop_after_step - in_run)
    for every in (config.checkpoint_every, config.eval_every):
        if every:
            due.append(every - in_run % every)
    return min(due)


def build_stages(optimizers: object, trained: dict[str, keras.Model], config: TrainConfig) -> list[Stage]:
    """One stage per optimizer from optim.py, in its order, each updating the model of the same name;
    with --ema-decay, each optimizer also averages the weights it updates (ema.py)."""
    named: dict[str, object] = optimizers if isinstance(optimizers, dict) else {"model": optimizers}
    if sorted(named) != sorted(trained):
        raise DataError(
            f"optim.py: build_optimizer must return one optimizer per trained model of model.py, by the same "
            f"names: {sorted(trained)}, got {sorted(named)} (set model.trainable = False on a frozen one)"
        )
    stages = []
    for name, optimizer in named.items():
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise DataError(
                f"optim.py: build_optimizer must return a keras optimizer or a dict of them; {name!r} is {optimizer!r}"
            )
        if config.ema_decay:
            keep_average(optimizer, config.ema_decay)
        apply_as_given(optimizer)
        if config.precision == "fp16":
            # fp16 gradients can underflow: the loss is scaled up before backprop; an update with
            # inf/NaN gradients is skipped and the scale lowered.
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(trained[name].trainable_variables)  # its state must exist before a restore
        stages.append(Stage(name, optimizer, trained[name]))
    return stages


def apply_as_given(optimizer: keras.optimizers.Optimizer) -> None:
    """Make the optimizer apply the gradients it is given. The loop gives it gradients summed over the
    replicas and clipped already (train.py), and Keras 3's apply_gradients would sum them over the
    replicas once more: an all-reduce per update for nothing, and R times the gradient. Keras has no
    switch for it, so the method that sums is replaced, on this optimizer only, by one that keeps them."""
    if not callable(getattr(optimizer, "_all_reduce_sum_gradients", None)):
        raise RunError(
            f"keras {keras.__version__} has no optimizer._all_reduce_sum_gradients, which this loop turns off "
            "(it would sum the gradients over the replicas twice): install the keras 3 this project was "
            "tested with, or update the project (looptpl update)"
        )
    optimizer._all_reduce_sum_gradients = list  # type: ignore[method-assign]


def grad_norms(stages: list[Stage]) -> dict[str, float]:
    """Each stage's gradient norm at its last update, before clipping: `grad_norm`, or `grad_norm_<name>`
    for each of several optimizers."""
    norms = {}
    for stage in stages:
        norms["grad_norm" if len(stages) == 1 else f"grad_norm_{stage.name}"] = float(stage.grad_norm.numpy())
    return norms


def not_finite_message(stage: Stage, stages: list[Stage], config: TrainConfig, where: str) -> str:
    """Why the run stops: the NaN/inf update that --nan-policy stop refuses, or too many skipped in a row."""
    advice = "lower --lr, check your data for NaN/inf"
    which = "" if len(stages) == 1 else f"the {stage.name} "
    if config.nan_policy == "skip":
        skips = config.max_consecutive_skips + 1
        return (
            f"{which or 'the '}loss or gradients were NaN/inf for {skips} updates in a row ({where}); the weights "
            f"have diverged: {advice}, or use --precision fp32"
        )
    loss = float(stage.skipped_loss.numpy())
    problem = f"{which}training loss is {loss}"
    if math.isfinite(loss):  # the loss was fine, its gradients were not
        problem = f"the {which}gradients are NaN/inf (training loss {loss:.4g})"
    return f"{problem} at {where}; {advice}, or use --precision fp32"


def mean_losses(stages: list[Stage], totals: Any) -> dict[str, float]:
    """Each stage's mean training loss from its totals row (loss total, weight kept, ...), under its log
    name: `train_loss`, or `train_<name>_loss` with several; NaN where nothing was kept."""
    means = {}
    for stage, (total, kept, *_) in zip(stages, totals, strict=True):
        name = "train_loss" if len(stages) == 1 else f"train_{stage.name}_loss"
        means[name] = total / kept if kept else math.nan
    return means
