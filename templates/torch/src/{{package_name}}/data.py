"""Your data: the train, validation and test datasets.

This file is yours: `copier update` keeps your edits here.
The default is a synthetic classification task so the project trains before any edit.
"""

import torch
from torch.utils.data import Dataset, TensorDataset

from .config import TrainConfig

# TODO(data): set these to your inputs and targets; model.py reads them to size the network.
NUM_FEATURES = 16
NUM_CLASSES = 4


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset]:
    """Return the (train, validation, test) datasets.

    Every item must be an `(inputs, targets)` pair. Every rank calls this with the same
    config and must get the same datasets: the engine shards them, so do not shard here.
    """
    # TODO(data): load your data here instead of the synthetic task below. The sizes are odd on
    # purpose: they exercise the short last batch and uneven evaluation shards.
    generator = torch.Generator().manual_seed(1234)  # fixed, so every rank builds the same data
    hidden = torch.randn(NUM_FEATURES, 32, generator=generator)
    readout = torch.randn(32, NUM_CLASSES, generator=generator)

    def make_split(size: int) -> TensorDataset:
        inputs = torch.randn(size, NUM_FEATURES, generator=generator)
        targets = (torch.tanh(inputs @ hidden) @ readout).argmax(dim=1)
        return TensorDataset(inputs, targets)

    return make_split(1003), make_split(251), make_split(257)
