"""Your step: next-byte prediction, the loss averaged over every token of the global batch.

This file is yours: `copier update` keeps your edits here.
"""

from typing import Any

import keras

from .kit.api import Gather, Mean, evaluation
from .kit.config import TrainConfig
from .loss import per_token_loss
from .metrics import batch_metrics


def train_step(model: keras.Model, batch: Any, config: TrainConfig) -> Mean:
    """The loss of every real token of the micro-batch; the engine averages over the global batch's tokens."""
    losses, mask = per_token_loss(model(batch["input_ids"], training=True), batch["labels"])
    return Mean(losses, weights=mask, per="token")


def eval_step(model: keras.Model, batch: Any, config: TrainConfig) -> dict[str, Mean | Gather]:
    """The loss and metrics of one evaluation batch; logged as val_<name> and test_<name>."""
    logits = model(batch["input_ids"], training=False)
    losses, mask = per_token_loss(logits, batch["labels"])
    return evaluation(loss=Mean(losses, weights=mask, per="token"), metrics=batch_metrics(logits, batch["labels"]))
