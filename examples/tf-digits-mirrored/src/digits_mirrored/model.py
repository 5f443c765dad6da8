"""Your model.

This file is yours: `copier update` keeps your edits here.
"""

import keras

from .data import IMAGE_SHAPE, NUM_CLASSES
from .kit.config import TrainConfig


def build_model(config: TrainConfig) -> keras.Model:
    """Build the network; the engine calls this under `strategy.scope()`.

    Start from `keras.Input` so the weights exist at once: the optimizer and the checkpoint need
    them before the first step. Every worker builds it with the same seed, so all replicas start
    from identical weights. Under --precision bf16/fp16 the layers compute in that type.
    """
    # A small CNN: two 3x3 convolutions at 8x8, one 2x2 pooling, a two-layer head (~150k weights).
    # No dropout: each replica would draw its own masks, and 1 and 2 replicas would no longer agree.
    return keras.Sequential(
        [
            keras.Input(shape=IMAGE_SHAPE),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
