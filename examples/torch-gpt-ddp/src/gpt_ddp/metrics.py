"""Your evaluation metrics.

This file is yours: `copier update` keeps your edits here.
"""

import math

import torch

from .data import IGNORE
from .kit.api import Gather, Mean


def batch_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, Mean | Gather]:
    """Each metric of one evaluation batch: how often the next byte is guessed right, per real token."""
    mask = labels != IGNORE
    correct = (logits.argmax(dim=-1) == labels).float()
    return {"accuracy": Mean(correct, weights=mask, per="token")}


def dataset_metrics(means: dict[str, float], gathered: dict[str, torch.Tensor]) -> dict[str, float]:
    """Perplexity: e to the mean loss per real token of the whole split (not a mean of per-batch values)."""
    return {"perplexity": math.exp(means["loss"])}
