"""Your loss, one value per token.

This file is yours: `copier update` keeps your edits here.
"""

import torch
from torch.nn import functional as F

from .data import IGNORE


def per_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cross-entropy of every position, and a mask of the real (not padding) ones.

    eval_step hands both to `Mean(losses, weights=mask)`: the loop divides by the real tokens of the
    whole global batch. A window has no padding, so every position counts (train_step needs no mask);
    the mask keeps the loss right for data that pads (documents shorter than the context, say).
    """
    losses = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none", ignore_index=IGNORE)
    return losses, (labels.flatten() != IGNORE)
