"""Your data: the train, validation and test datasets, and how their items become batches.

This file is yours: `copier update` keeps your edits here.
The 8x8 handwritten digits that ship with scikit-learn (1797 images, 10 classes): nothing is downloaded.
"""

from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, default_collate

from .kit.config import TrainConfig

PIXELS = 64  # 8 x 8, in [-1, 1]
NUM_CLASSES = 10
SPLIT_SEED = 0  # fixed, not --seed: every run and every rank must hold out the same images
NOISE_SEED = 1234


class Digits(Dataset):
    """Item i: {"image": 64 pixels, "label": its digit, "noise": the generator's input for this item}.

    The noise is a fixed function of the item (drawn once, here), not drawn in the step: every rank
    then feeds the generator exactly what one process would, so 1 and N ranks train alike.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, latent_size: int, seed: int) -> None:
        self.images, self.labels = images, labels
        self.noise = torch.randn(len(labels), latent_size, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"image": self.images[index], "label": self.labels[index], "noise": self.noise[index]}


def load_images() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1797 digits as rows of 64 pixels in [-1, 1], and their labels."""
    digits = load_digits()
    images = torch.from_numpy(digits.images.reshape(-1, PIXELS) / 8.0 - 1.0).float()
    return images, torch.from_numpy(digits.target).long()


def split_indices() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A stratified 70/15/15 split of the digits: 1257 / 270 / 270."""
    labels = load_digits().target
    rest, test = train_test_split(np.arange(len(labels)), test_size=0.15, stratify=labels, random_state=SPLIT_SEED)
    train, val = train_test_split(rest, test_size=len(test), stratify=labels[rest], random_state=SPLIT_SEED)
    return np.sort(train), np.sort(val), np.sort(test)


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset]:
    """Return the (train, validation, test) datasets.

    Evaluation asks the generator for one image of each held-out image's class (model.py's judge
    then names the digit it sees), so the validation and test splits fix the requested classes.
    """
    images, labels = load_images()
    splits = [torch.from_numpy(rows) for rows in split_indices()]
    return tuple(  # type: ignore[return-value]
        Digits(images[rows], labels[rows], config.latent_size, NOISE_SEED + number)
        for number, rows in enumerate(splits)
    )


def collate(items: list[Any]) -> Any:
    """Stack the items' tensors into one batch dict."""
    return default_collate(items)
