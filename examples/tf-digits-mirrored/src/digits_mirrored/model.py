"""Your model.

This file is yours: `copier update` keeps your edits here.
"""

import keras
import tensorflow as tf

from .config import TrainConfig
from .data import IMAGE_SHAPE, NUM_CLASSES


class SkipEmptyBatches(keras.Model):
    """Run `network` on a non-empty batch; return an empty batch of outputs for an empty one.

    At the end of an epoch, and in the last evaluation step, a replica may get no samples at all.
    On the CPU, TensorFlow's oneDNN Conv2D (tensorflow-cpu 2.21, inside a tf.function) returns an
    empty batch with the wrong number of channels, and the next convolution fails with "input depth
    must be evenly divisible by filter depth". An empty batch adds nothing to the loss, the
    gradients or the metrics, so skipping the network for it changes no result.
    """

    def __init__(self, network: keras.Model) -> None:
        super().__init__()
        self.network = network

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        return tf.cond(
            tf.shape(inputs)[0] > 0,
            lambda: self.network(inputs),
            lambda: tf.zeros((0, NUM_CLASSES), dtype=self.network.compute_dtype),
        )


def build_model(config: TrainConfig) -> keras.Model:
    """Build the network; the engine calls this under `strategy.scope()`.

    Start from `keras.Input` so the weights exist at once: the optimizer and the checkpoint need
    them before the first step. Every worker builds it with the same seed, so all replicas start
    from identical weights. Under --precision bf16/fp16 the layers compute in that type.
    """
    # A small CNN: two 3x3 convolutions at 8x8, one 2x2 pooling, a two-layer head (~150k weights).
    # No dropout: each replica would draw its own masks, and 1 and 2 replicas would no longer agree.
    network = keras.Sequential(
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
    return SkipEmptyBatches(network)
