"""Your data: the train, validation and test datasets, and how their items become batches.

This file is yours: `copier update` keeps your edits here.
The default is a synthetic classification task so the project trains before any edit.
"""

import numpy as np
import tensorflow as tf

from .kit.config import TrainConfig

# TODO(data): set these to your inputs and targets; model.py reads them to size the network.
NUM_FEATURES = 16
NUM_CLASSES = 4


def build_datasets(config: TrainConfig) -> tuple[tf.data.Dataset, tf.data.Dataset, tf.data.Dataset | None]:
    """Return the (train, validation, test) datasets, each a `tf.data.Dataset` of single samples; the test
    set may be None (no final test: the summary then gives the best epoch's validation figures).

    Every element is one sample, unbatched: a tensor, a tuple or a dict of tensors (step.py
    receives them batched by `make_batches`). Every worker calls this with the same config and
    must get the same samples in the same order: the loop shuffles, batches and shards, so do
    none of that here. A dataset of unknown size (`dataset.cardinality()`; read from files, say)
    is a stream: trained in its order, pass after pass, for --max-steps updates. To train a
    file-based one in shuffled epochs, add `.apply(tf.data.experimental.assert_cardinality(n))`.
    """
    # TODO(data): load your data here instead of the synthetic task below. The sizes are odd on
    # purpose: they exercise the short last batch and uneven evaluation shards.
    generator = np.random.default_rng(1234)  # fixed, so every worker builds the same data
    hidden = generator.standard_normal((NUM_FEATURES, 32))
    readout = generator.standard_normal((32, NUM_CLASSES))

    def make_split(size: int) -> tf.data.Dataset:
        inputs = generator.standard_normal((size, NUM_FEATURES))
        targets = (np.tanh(inputs @ hidden) @ readout).argmax(axis=1)
        return tf.data.Dataset.from_tensor_slices((inputs.astype(np.float32), targets.astype(np.int32)))

    return make_split(1007), make_split(251), make_split(257)


def make_batches(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """Cut a dataset of samples into batches of `batch_size` (the last one may be short).

    Pad variable-length sequences here: `dataset.padded_batch(batch_size)`. Keep every sample, in
    order: the loop has shuffled and sharded already and counts each sample once.
    """
    return dataset.batch(batch_size)
