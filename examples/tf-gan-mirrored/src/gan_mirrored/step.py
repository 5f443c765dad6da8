"""Your step: one discriminator update, then one generator update, on every batch.

This file is yours: `copier update` keeps your edits here.
"""

from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from .kit.api import Gather, Mean
from .kit.config import TrainConfig
from .loss import scored_as


def train_step(models: dict[str, keras.Model], batch: Any, config: TrainConfig) -> Iterator[tuple[str, Mean]]:
    """Yield the discriminator's loss, then the generator's: the engine updates each network in between.

    Each loss is computed inside its own stage: the generator's sees the discriminator just
    updated. Each stage takes gradients only of what it computes itself, so it draws the images
    again rather than reuse those of the first stage.
    """
    generator, discriminator = models["generator"], models["discriminator"]
    real, label, noise = batch["image"], batch["label"], batch["noise"]

    # Real images should score high, generated ones low: one loss value per image, 2B in all.
    fake = generator([noise, label], training=True)
    real_loss = scored_as(discriminator([real, label], training=True), real=True)
    fake_loss = scored_as(discriminator([fake, label], training=True), real=False)
    yield "discriminator", Mean(tf.concat([real_loss, fake_loss], axis=0))

    # The non-saturating generator loss: make the updated discriminator score generated images high.
    drawn = generator([noise, label], training=True)
    yield "generator", Mean(scored_as(discriminator([drawn, label], training=True), real=True))


def eval_step(models: dict[str, keras.Model], batch: Any, config: TrainConfig) -> dict[str, Mean | Gather]:
    """Draw one image of each requested digit; the judge names the digit it sees in it."""
    drawn = models["generator"]([batch["noise"], batch["label"]], training=False)
    named = models["judge"](drawn)
    real_scores = tf.sigmoid(models["discriminator"]([batch["image"], batch["label"]], training=False))
    return {
        "class_accuracy": Mean(tf.cast(named == batch["label"], tf.float32)),
        "real_score": Mean(real_scores),
        # Every drawn and real image of the split, for metrics.py's diversity.
        "drawn": Gather(drawn),
        "real": Gather(batch["image"]),
        "label": Gather(batch["label"]),
    }
