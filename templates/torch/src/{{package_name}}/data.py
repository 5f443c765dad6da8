"""Your data: the train, validation and test datasets, and how their items become batches.

This file is yours: `copier update` keeps your edits here.
The default is a synthetic classification task so the project trains before any edit.
"""

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from .kit.config import TrainConfig

# TODO(data): set these to your inputs and targets; model.py reads them to size the network.
NUM_FEATURES = 16
NUM_CLASSES = 4


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset | None]:
    """Return the (train, validation, test) datasets; the test set may be None (no final test: the
    summary then gives the best epoch's validation figures).

    An item can be anything `collate` turns into a batch: a tensor, a tuple, a dict. Every rank
    calls this with the same config and must get the same datasets: the loop shards them, so do
    not shard here. Open files lazily in `__getitem__` (not here): each DataLoader worker must
    open its own handle.
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


# Optional: define `prepare_data(config)` to download, tokenize or cache data before build_datasets
# runs. The first rank of each machine runs it while the others wait (up to a day), so a machine
# does the work once. On storage that several machines share, write each file under a temporary
# name and `os.replace` it into place (the machines prepare at the same time).


# How a list of items becomes one batch (step.py receives it on the device): torch's default_collate
# stacks tensors, also inside tuples and dicts. To pad variable-length sequences, say, replace it with
# a `def collate(items)` that returns the batch. Kept as it is, a TensorDataset's batch is fetched
# whole, one index of each tensor, far faster than row by row.
collate = default_collate
