"""Your model.

This file is yours: `copier update` keeps your edits here.
"""

import jax
from flax import nnx

from .data import IMAGE_SHAPE, NUM_CLASSES
from .kit.config import TrainConfig


class DigitsCNN(nnx.Module):
    """A small CNN: two 3x3 convolutions at 8x8, one 2x2 pooling, a two-layer head (~150k weights)."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        height, width, channels = IMAGE_SHAPE
        self.conv1 = nnx.Conv(channels, 32, kernel_size=(3, 3), padding="SAME", rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), padding="SAME", rngs=rngs)
        self.hidden = nnx.Linear(64 * (height // 2) * (width // 2), 128, rngs=rngs)
        self.output = nnx.Linear(128, NUM_CLASSES, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        features = nnx.max_pool(nnx.relu(self.conv2(nnx.relu(self.conv1(images)))), (2, 2), strides=(2, 2))
        return self.output(nnx.relu(self.hidden(features.reshape(features.shape[0], -1))))


def build_model(config: TrainConfig, rngs: nnx.Rngs) -> nnx.Module:
    """Build the network, its weights drawn from `rngs` (seeded from --seed): the same on every process."""
    return DigitsCNN(rngs)
