"""Your step: one discriminator update, then one generator update, on every batch.

This file is yours: `copier update` keeps your edits here.
"""

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .kit.api import Gather, Mean
from .kit.config import TrainConfig
from .loss import scored_as


def train_step(models: dict[str, nn.Module], batch: Any, config: TrainConfig) -> Iterator[tuple[str, Mean]]:
    """Yield the discriminator's loss, then the generator's: the engine steps each optimizer in between.

    Each loss is computed inside its own stage: the generator's sees the discriminator just updated.
    While a stage runs only its network takes gradients, so the generated images of the first
    stage carry no graph into the second; it draws them again.
    """
    generator, discriminator = models["generator"], models["discriminator"]
    real, label, noise = batch["image"], batch["label"], batch["noise"]

    # Real images should score high, generated ones low: one loss value per image, 2B in all.
    fake = generator(noise, label)
    real_loss, fake_loss = scored_as(discriminator(real, label), True), scored_as(discriminator(fake, label), False)
    yield "discriminator", Mean(torch.cat([real_loss, fake_loss]))

    # The non-saturating generator loss: make the updated discriminator score generated images high.
    yield "generator", Mean(scored_as(discriminator(generator(noise, label), label), True))


def eval_step(models: dict[str, nn.Module], batch: Any, config: TrainConfig) -> dict[str, Mean | Gather]:
    """Draw one image of each requested digit; the judge names the digit it sees in it."""
    drawn = models["generator"](batch["noise"], batch["label"])
    named = models["judge"](drawn)
    real_scores = torch.sigmoid(models["discriminator"](batch["image"], batch["label"]))
    return {
        "class_accuracy": Mean((named == batch["label"]).float()),
        "real_score": Mean(real_scores),
        # Every drawn and real image of the split, for metrics.py's diversity.
        "drawn": Gather(drawn),
        "real": Gather(batch["image"]),
        "label": Gather(batch["label"]),
    }
