"""Your data: the train, validation and test splits.

This file is yours: `copier update` keeps your edits here.
The default is a synthetic classification task so the project trains before any edit.
"""

from typing import Any

import numpy as np

from .kit.config import TrainConfig

# TODO(data): set these to your inputs and targets; model.py reads them to size the network.
NUM_FEATURES = 16
NUM_CLASSES = 4


def build_datasets(config: TrainConfig) -> tuple[Any, Any, Any | None]:
    """Return the (train, validation, test) splits; the test set may be None (no final test).

    A split is NumPy arrays with one row per sample, as a tuple or a dict (a batch is then the same
    tuple or dict, each array cut to the batch's rows), or a dataset with __len__ and __getitem__
    whose items are such arrays, or a stream: an object whose __iter__ yields such items, pass after
    pass, for data that does not fit in memory (train it for --max-steps; docs/jax.md). Every process
    calls this with the same config and must get the same splits: the loop gives each process its
    rows, so do not shard here.
    """
    # TODO(data): load your data here instead of the synthetic task below. The sizes are odd on
    # purpose: they exercise the short last batch and padded evaluation batches.
    generator = np.random.default_rng(1234)  # fixed, so every process builds the same data
    hidden = generator.normal(size=(NUM_FEATURES, 32)).astype(np.float32)
    readout = generator.normal(size=(32, NUM_CLASSES)).astype(np.float32)

    def make_split(size: int) -> tuple[np.ndarray, np.ndarray]:
        inputs = generator.normal(size=(size, NUM_FEATURES)).astype(np.float32)
        targets = (np.tanh(inputs @ hidden) @ readout).argmax(axis=1).astype(np.int32)
        return inputs, targets

    return make_split(1003), make_split(251), make_split(257)
