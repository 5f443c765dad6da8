"""Your step: how a batch trains and evaluates your model.

This file is yours: `copier update` keeps your edits here.
"""

from typing import Any

from torch import nn

from .kit.api import Gather, Mean, evaluation
from .kit.config import TrainConfig
from .loss import per_token_loss
from .metrics import batch_metrics


def train_step(model: nn.Module, batch: Any, config: TrainConfig) -> Mean:
    """The mean loss over the tokens of the micro-batch, which the engine extends to the global batch.

    A window has no padding, so every position counts and the loss needs no weights: its weight (64 tokens a
    window) is then counted on every rank, not summed over the ranks at each update. Data that pads would
    pass `weights=mask`, as eval_step does.
    """
    losses, _ = per_token_loss(model(batch["input_ids"]), batch["labels"])
    return Mean(losses, per="token")


def eval_step(model: nn.Module, batch: Any, config: TrainConfig) -> dict[str, Mean | Gather]:
    """The loss and metrics of one evaluation batch; logged as val_<name> and test_<name>."""
    logits = model(batch["input_ids"])
    losses, mask = per_token_loss(logits, batch["labels"])
    return evaluation(loss=Mean(losses, weights=mask, per="token"), metrics=batch_metrics(logits, batch["labels"]))
