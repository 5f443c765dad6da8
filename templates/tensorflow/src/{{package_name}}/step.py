"""Your step: how a batch trains and evaluates your model.

This file is yours: `copier update` keeps your edits here.

The loop calls `train_step` once per micro-batch and `eval_step` once per evaluation batch,
on every replica, inside its tf.function, traced once as the Python it is (AutoGraph does not
rewrite it): decide on a tensor's value with tf.where or tf.cond, not `if`. Return values to
average (`Mean`) and the loop does the rest: it averages them over the whole global batch (every
replica and accumulation micro-step), computes the gradients, sums them over the replicas, clips
and applies them.
docs/todos.md shows other shapes: a language model with token-weighted loss, dict batches, a GAN
(several optimizers), distillation and a contrastive loss.
"""

from typing import Any

import keras

from .kit.api import Gather, Mean, evaluation
from .kit.config import TrainConfig
from .loss import per_sample_loss
from .metrics import batch_metrics


def train_step(model: keras.Model, batch: Any, config: TrainConfig) -> Mean:
    """The loss of one micro-batch on this replica, as a `Mean` of per-sample (or per-token) values.

    `model` is what model.py built; `config` holds every flag, yours from settings.py too. With
    several optimizers (optim.py returns a dict), make this a generator that yields
    `name, Mean(...)` once per optimizer, in the dict's order: the loop applies that
    optimizer's update before resuming the generator.
    """
    # TODO(step): call your model the way it takes your batch; here a batch is an (inputs, targets) pair.
    inputs, targets = batch
    return Mean(per_sample_loss(model(inputs, training=True), targets))


def eval_step(model: keras.Model, batch: Any, config: TrainConfig) -> dict[str, Mean | Gather]:
    """The loss and metrics of one evaluation batch; logged as val_<name> and test_<name>."""
    inputs, targets = batch
    outputs = model(inputs, training=False)
    return evaluation(loss=Mean(per_sample_loss(outputs, targets)), metrics=batch_metrics(outputs, targets))
