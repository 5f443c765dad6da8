"""Your model.

This file is yours: `copier update` keeps your edits here.
"""

from torch import nn

from .data import IMAGE_SHAPE, NUM_CLASSES
from .kit.config import TrainConfig


def build_model(config: TrainConfig) -> nn.Module:
    """Build the network on the CPU; the engine moves it to the device and wraps it.

    Every rank builds it with the same seed, so all replicas start from identical weights.
    """
    channels, height, width = IMAGE_SHAPE
    # A small CNN: two 3x3 convolutions at 8x8, one 2x2 pooling, a two-layer head (~150k weights).
    return nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * (height // 2) * (width // 2), 128),
        nn.ReLU(),
        nn.Linear(128, NUM_CLASSES),
    )
