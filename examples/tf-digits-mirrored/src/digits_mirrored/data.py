"""Your data: the train, validation and test datasets.

This file is yours: `copier update` keeps your edits here.
The 8x8 handwritten digits that ship with scikit-learn (1797 images, 10 classes): nothing is downloaded.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from .kit.config import TrainConfig

IMAGE_SHAPE = (8, 8, 1)  # height, width, channels: Keras convolutions are channels-last
NUM_CLASSES = 10
SPLIT_SEED = 0  # fixed, not --seed: every run and every worker must hold out the same test images
TEST_FRACTION = 0.15  # and as many validation images: 1257 / 270 / 270


def build_datasets(config: TrainConfig) -> tuple[tf.data.Dataset, tf.data.Dataset, tf.data.Dataset]:
    """Return the (train, validation, test) datasets: a stratified 70/15/15 split of the digits.

    Every element must be one `(inputs, targets)` pair, unbatched, and each dataset must have a
    known size (`dataset.cardinality()`; add `.apply(tf.data.experimental.assert_cardinality(n))`
    to a file-based one). Every worker calls this with the same config and must get the same
    samples in the same order: the engine shuffles, batches and shards, so do none of that here.
    """
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, *IMAGE_SHAPE)  # pixels 0..16 -> [0, 1]
    labels = digits.target.astype(np.int32)

    indices = np.arange(len(labels))
    rest, test = train_test_split(indices, test_size=TEST_FRACTION, stratify=labels, random_state=SPLIT_SEED)
    train, val = train_test_split(rest, test_size=len(test), stratify=labels[rest], random_state=SPLIT_SEED)

    def make_split(split: np.ndarray) -> tf.data.Dataset:
        rows = np.sort(split)
        return tf.data.Dataset.from_tensor_slices((images[rows], labels[rows]))

    return make_split(train), make_split(val), make_split(test)


def make_batches(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """Stack the (image, label) samples into batches."""
    return dataset.batch(batch_size)
