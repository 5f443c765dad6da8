"""Your data: the train, validation and test datasets.

This file is yours: `copier update` keeps your edits here.
The 8x8 handwritten digits that ship with scikit-learn (1797 images, 10 classes): nothing is downloaded.
"""

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, TensorDataset

from .kit.config import TrainConfig

IMAGE_SHAPE = (1, 8, 8)  # channels, height, width
NUM_CLASSES = 10
SPLIT_SEED = 0  # fixed, not --seed: every run and every rank must hold out the same test images
TEST_FRACTION = 0.15  # and as many validation images: 1257 / 270 / 270


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset]:
    """Return the (train, validation, test) datasets: a stratified 70/15/15 split of the digits.

    Every item is an `(inputs, targets)` pair, which step.py unpacks. Every rank calls this with the
    same config and must get the same datasets: the engine shards them, so do not shard here.
    """
    digits = load_digits()
    images = torch.from_numpy(digits.images / 16.0).float().reshape(-1, *IMAGE_SHAPE)  # pixels 0..16 -> [0, 1]
    labels = torch.from_numpy(digits.target).long()

    indices = np.arange(len(labels))
    rest, test = train_test_split(indices, test_size=TEST_FRACTION, stratify=digits.target, random_state=SPLIT_SEED)
    train, val = train_test_split(rest, test_size=len(test), stratify=digits.target[rest], random_state=SPLIT_SEED)

    def make_split(split: np.ndarray) -> TensorDataset:
        rows = torch.from_numpy(np.sort(split))
        return TensorDataset(images[rows], labels[rows])

    return make_split(train), make_split(val), make_split(test)
