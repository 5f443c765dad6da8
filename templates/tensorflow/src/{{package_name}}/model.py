"""Your model.

This file is yours: `copier update` keeps your edits here.
"""

import keras

from .data import NUM_CLASSES, NUM_FEATURES
from .kit.config import TrainConfig


def build_model(config: TrainConfig) -> keras.Model:
    """Build the network; the loop calls this under `strategy.scope()`.

    Start from `keras.Input` so the weights exist at once: the optimizer and the checkpoint need
    them before the first step. Every worker builds it with the same seed, so all replicas start
    from identical weights. Under --precision bf16/fp16 the layers compute in that type.
    """
    # TODO(model): replace this small MLP with your network.
    return keras.Sequential(
        [
            keras.Input(shape=(NUM_FEATURES,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
