"""Your losses: how far the discriminator's scores are from "real" or "generated".

This file is yours: `copier update` keeps your edits here.
"""

import torch
from torch.nn import functional as F


def scored_as(scores: torch.Tensor, real: bool) -> torch.Tensor:
    """Binary cross-entropy of each score against one label (real = 1, generated = 0), one value per image."""
    labels = torch.full_like(scores, 1.0 if real else 0.0)
    return F.binary_cross_entropy_with_logits(scores.float(), labels, reduction="none")
