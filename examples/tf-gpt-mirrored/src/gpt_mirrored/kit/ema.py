"""An exponential moving average of the trained weights (--ema-decay), evaluated beside them.

Managed by the looptpl template.

It is Keras' own (`use_ema`): each optimizer keeps the average of the weights it updates. After
every update, average = decay * average + (1 - decay) * weights; the first update copies the
weights. The averages are optimizer variables, so the checkpoint holds them and --resume
continues them exactly. Only trainable weights are averaged: the others (batch norm statistics)
are the model's own.
"""

import contextlib
from collections.abc import Iterator

import keras
import tensorflow as tf


def keep_average(optimizer: keras.optimizers.Optimizer, decay: float) -> None:
    """Have `optimizer` average the weights it updates; call this before it is built."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # through a LossScaleOptimizer (fp16)
    inner.use_ema, inner.ema_momentum = True, decay


class WeightAverage:
    """The averages kept by the optimizers, swapped into the models for an evaluation."""

    def __init__(self, optimizers: list[tuple[keras.optimizers.Optimizer, list[tf.Variable]]]) -> None:
        """`optimizers`: each optimizer with the weights it updates (a stage's)."""
        self.pairs: list[tuple[tf.Variable, tf.Variable]] = []
        for optimizer, variables in optimizers:
            inner = getattr(optimizer, "inner_optimizer", optimizer)
            self.pairs += zip(variables, inner._model_variables_moving_average, strict=True)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Inside the block the models hold the averages; after it, their own weights again."""
        weights = [tf.identity(variable) for variable, _ in self.pairs]
        for variable, average in self.pairs:
            variable.assign(average)
        try:
            yield
        finally:
            for (variable, _), value in zip(self.pairs, weights, strict=True):
                variable.assign(value)
