"""Which samples each rank sees. Managed by the looptpl template: edit data.py instead.

Training: every epoch one seeded permutation, identical on all ranks, is cut into global batches;
each global batch is split into `world_size * grad_accum_steps` micro-batches and each rank takes
its own. The union over ranks and micro-steps is exactly the global batch that a single process
would see, so N ranks train like 1 rank with the same global batch.

Evaluation: rank r takes samples r, r + N, r + 2N, ... Short shards are padded with a repeated
sample so every rank runs the same number of batches (FSDP needs that: each forward is a
collective); the engine masks the padding out, so every sample counts exactly once.
"""

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .config import TrainConfig
from .errors import DataError


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches of indices, `grad_accum_steps` per optimizer update."""

    def __init__(
        self, dataset_size: int, global_batch_size: int, grad_accum_steps: int, rank: int, world_size: int, seed: int
    ) -> None:
        self.dataset_size = dataset_size
        self.global_batch_size = global_batch_size
        self.splits = world_size * grad_accum_steps
        self.grad_accum_steps = grad_accum_steps
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        # A short last global batch is kept if every micro-batch gets at least one sample.
        full, rest = divmod(dataset_size, global_batch_size)
        self.updates_per_epoch = full + (1 if rest >= self.splits else 0)
        self.samples_per_epoch = full * global_batch_size + (rest if rest >= self.splits else 0)

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle: each epoch uses its own permutation, the same on every rank."""
        self.epoch = epoch

    def global_batch_sizes(self) -> list[int]:
        """Samples in each global batch of an epoch (the last one may be short)."""
        sizes = [self.global_batch_size] * (self.samples_per_epoch // self.global_batch_size)
        if self.samples_per_epoch % self.global_batch_size:
            sizes.append(self.samples_per_epoch % self.global_batch_size)
        return sizes

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.dataset_size, generator=generator)[: self.samples_per_epoch]
        for global_batch in order.split(self.global_batch_size):
            # tensor_split gives near-equal parts, so a short last batch is spread evenly.
            parts = global_batch.tensor_split(self.splits)
            for micro_step in range(self.grad_accum_steps):
                yield parts[micro_step * self.world_size + self.rank].tolist()

    def __len__(self) -> int:
        return self.updates_per_epoch * self.grad_accum_steps


class EvalShardSampler(Sampler[int]):
    """Rank r's share of an evaluation set, padded to the longest shard; `real_size` are genuine."""

    def __init__(self, dataset_size: int, rank: int, world_size: int) -> None:
        self.indices = list(range(rank, dataset_size, world_size))
        self.real_size = len(self.indices)
        longest = -(-dataset_size // world_size)
        self.indices += [0] * (longest - self.real_size)  # padding, masked out by the engine

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


@dataclass
class Loaders:
    """This rank's data loaders, and the sampler that drives training."""

    train: DataLoader
    train_sampler: GlobalBatchSampler
    val: DataLoader
    test: DataLoader


def build_loaders(
    datasets: tuple[Dataset, Dataset, Dataset], config: TrainConfig, rank: int, world_size: int, pin_memory: bool
) -> Loaders:
    """Wrap data.py's datasets in loaders that give this rank its share of each split."""
    train_set, val_set, test_set = datasets
    train_sampler = GlobalBatchSampler(
        split_size(train_set, "train"), config.global_batch_size, config.grad_accum_steps, rank, world_size, config.seed
    )
    if train_sampler.updates_per_epoch == 0:
        raise DataError(
            f"data.py: the train set has {len(train_set)} samples, too few for one update split over "  # type: ignore[arg-type]
            f"{world_size} ranks x {config.grad_accum_steps} micro-steps; lower --global-batch-size or add data"
        )
    make_loader = functools.partial(
        DataLoader, num_workers=config.num_workers, pin_memory=pin_memory, persistent_workers=config.num_workers > 0
    )

    def eval_loader(dataset: Dataset, split: str) -> DataLoader:
        sampler = EvalShardSampler(split_size(dataset, split), rank, world_size)
        return make_loader(dataset, batch_size=config.eval_batch_size, sampler=sampler)

    return Loaders(
        train=make_loader(train_set, batch_sampler=train_sampler),
        train_sampler=train_sampler,
        val=eval_loader(val_set, "val"),
        test=eval_loader(test_set, "test"),
    )


def split_size(dataset: Dataset, split: str) -> int:
    """Length of a split, with a clear error when data.py returned something unusable."""
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise DataError(f"data.py: the {split} dataset must be a map-style Dataset with a length") from None
    if size == 0:
        raise DataError(f"data.py: the {split} dataset is empty")
    return size
