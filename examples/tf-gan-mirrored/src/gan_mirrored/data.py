"""Your data: the train, validation and test datasets, and how their items become batches.

This file is yours: `copier update` keeps your edits here.
The 8x8 handwritten digits that ship with scikit-learn (1797 images, 10 classes): nothing is downloaded.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from .kit.config import TrainConfig

PIXELS = 64  # 8 x 8, in [-1, 1]
NUM_CLASSES = 10
SPLIT_SEED = 0  # fixed, not --seed: every run and every worker must hold out the same images
NOISE_SEED = 1234


def load_images() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits as rows of 64 pixels in [-1, 1], and their labels."""
    digits = load_digits()
    return (digits.images.reshape(-1, PIXELS) / 8.0 - 1.0).astype(np.float32), digits.target.astype(np.int32)


def split_indices() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A stratified 70/15/15 split of the digits: 1257 / 270 / 270."""
    labels = load_digits().target
    rest, test = train_test_split(np.arange(len(labels)), test_size=0.15, stratify=labels, random_state=SPLIT_SEED)
    train, val = train_test_split(rest, test_size=len(test), stratify=labels[rest], random_state=SPLIT_SEED)
    return np.sort(train), np.sort(val), np.sort(test)


def build_datasets(config: TrainConfig) -> tuple[tf.data.Dataset, tf.data.Dataset, tf.data.Dataset]:
    """Return the (train, validation, test) datasets of {"image", "label", "noise"} samples.

    The noise is a fixed function of the sample (drawn once, here), not drawn in the step: every
    replica then feeds the generator exactly what one replica would, so 1 and N replicas train
    alike. Evaluation asks the generator for one image of each held-out image's class (model.py's
    judge then names the digit it sees), so the validation and test splits fix the requested classes.
    """
    images, labels = load_images()

    def make_split(rows: np.ndarray, seed: int) -> tf.data.Dataset:
        noise = np.random.default_rng(seed).standard_normal((len(rows), config.latent_size)).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices({"image": images[rows], "label": labels[rows], "noise": noise})

    train, val, test = (make_split(rows, NOISE_SEED + number) for number, rows in enumerate(split_indices()))
    return train, val, test


def make_batches(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """Stack the samples' tensors into batch dicts."""
    return dataset.batch(batch_size)
