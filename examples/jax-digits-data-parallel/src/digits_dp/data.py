"""Your data: the train, validation and test splits.

This file is yours: `copier update` keeps your edits here.
The 8x8 handwritten digits that ship with scikit-learn (1797 images, 10 classes): nothing is downloaded.
"""

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from .kit.config import TrainConfig

IMAGE_SHAPE = (8, 8, 1)  # height, width, channels: Flax's convolutions take channels last
NUM_CLASSES = 10
SPLIT_SEED = 0  # fixed, not --seed: every run and every process must hold out the same test images
TEST_FRACTION = 0.15  # and as many validation images: 1257 / 270 / 270


def build_datasets(config: TrainConfig) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Return the (train, validation, test) splits: a stratified 70/15/15 split of the digits.

    Each split is an `(images, labels)` pair of arrays, one row per image, which step.py unpacks. Every
    process calls this with the same config and gets the same splits: the loop gives each its rows.
    """
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, *IMAGE_SHAPE)  # pixels 0..16 -> [0, 1]
    labels = digits.target.astype(np.int32)

    indices = np.arange(len(labels))
    rest, test = train_test_split(indices, test_size=TEST_FRACTION, stratify=labels, random_state=SPLIT_SEED)
    train, val = train_test_split(rest, test_size=len(test), stratify=labels[rest], random_state=SPLIT_SEED)
    return tuple((images[np.sort(split)], labels[np.sort(split)]) for split in (train, val, test))
