"""Your step: how a batch trains and evaluates your model.

This file is yours: `copier update` keeps your edits here.
"""

from typing import Any

from flax import nnx

from .kit.api import Gather, Mean, evaluation
from .kit.config import TrainConfig
from .loss import per_token_loss
from .metrics import batch_metrics


def train_step(model: nnx.Module, batch: Any, config: TrainConfig) -> Mean:
    """The mean loss over the real tokens of the micro-batch, which the loop extends to the global batch."""
    losses = per_token_loss(model(batch["input_ids"]), batch["labels"])
    return Mean(losses, weights=batch["mask"], per="token")


def eval_step(model: nnx.Module, batch: Any, config: TrainConfig) -> dict[str, Mean | Gather]:
    """The loss and metrics of one evaluation batch; logged as val_<name> and test_<name>."""
    logits = model(batch["input_ids"])
    loss = Mean(per_token_loss(logits, batch["labels"]), weights=batch["mask"], per="token")
    return evaluation(loss=loss, metrics=batch_metrics(logits, batch["labels"], batch["mask"]))
