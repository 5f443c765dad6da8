"""Which items of a stream each rank sees. Managed by the looptpl template: edit data.py instead.

A stream (data.py returns a torch IterableDataset) has no length and no random access. Every
rank, and every DataLoader worker, reads all of it in the order data.py yields it and keeps its
own share, so data.py must yield the same items in the same order everywhere, and must not shard.

Training: the stream's consecutive items are cut into global batches, and each global batch is
split over ranks and micro-steps exactly as sampling.py splits a permutation, so N ranks train
like one rank with the same global batch and every item is used once per pass. When the stream
ends, the next pass starts: data.py's `set_epoch(n)`, if the data set has one, can reorder pass n.
A resumed run reads its pass again up to where it stopped, with each item's random draws seeded
from (--seed, pass, position), so it continues exactly as the uninterrupted run did.

Evaluation: rank r keeps the items at positions r, r + N, r + 2N, ... (with --eval-batches, of the
stream's first items only). Having read them all, every rank knows how long each shard was, and
one short of the longest runs padding batches whose values are dropped, as sampling.EvalBatchSampler
does.
"""

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from .config import TrainConfig
from .errors import DataError
from .sampling import callers_generators_kept, sample_seeds, seed_generators, split_evenly

END = object()  # what `_next_item` returns once the stream has no more


class TrainStream(IterableDataset):
    """Yields this rank's micro-batches of each update, one update per item, in the stream's order."""

    def __init__(self, dataset: IterableDataset, config: TrainConfig, rank: int, world_size: int) -> None:
        self.dataset = dataset
        self.global_batch_size = config.global_batch_size
        self.grad_accum_steps = config.grad_accum_steps
        self.splits = world_size * config.grad_accum_steps
        self.rank = rank
        self.world_size = world_size
        self.seed = config.seed
        self.start = (0, 0)  # (pass, global batches of it already trained on): where a resumed run goes on

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # With DataLoader workers, worker k yields updates k, k + K, ...: the loader takes them in turn.
        worker = get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        epoch, skip = self.start
        update = 0  # updates yielded so far by all workers together
        while True:
            batches = 0
            for index, items in enumerate(self._global_batches(epoch)):
                batches += 1
                if index < skip:
                    continue  # trained on before the run was resumed
                if update % workers == worker_id:
                    parts = split_evenly(items, self.splits)
                    micro_batches = [parts[step * self.world_size + self.rank] for step in range(self.grad_accum_steps)]
                    yield {"position": (epoch, index + 1), "samples": len(items), "micro_batches": micro_batches}
                update += 1
            if batches == 0:
                raise DataError(
                    f"data.py: pass {epoch} over the train stream gave no global batch (fewer than {self.splits} "
                    "items); check that __iter__ yields items again for every pass"
                )
            epoch, skip = epoch + 1, 0

    def _global_batches(self, epoch: int) -> Iterator[list[Any]]:
        """Pass `epoch` over the stream in global batches; a short last one is kept if each micro-batch gets an item."""
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        items, position = iter(self.dataset), 0
        while True:
            batch: list[Any] = []
            with callers_generators_kept():
                while len(batch) < self.global_batch_size:
                    item = _next_item(items, self.seed, epoch, position)
                    if item is END:
                        break
                    batch.append(item)
                    position += 1
            if len(batch) >= self.splits:
                yield batch
            if len(batch) < self.global_batch_size:
                return

    def collater(self, collate: Callable[[list[Any]], Any]) -> Callable[[Any], dict[str, Any]]:
        """The DataLoader's collate_fn: each micro-batch's items made into a batch."""

        def collate_update(update: dict[str, Any]) -> dict[str, Any]:
            return {**update, "micro_batches": [collate(items) for items in update["micro_batches"]]}

        return collate_update


class EvalStream(IterableDataset):
    """Yields this rank's evaluation batches of a stream, with padding batches up to the longest shard."""

    def __init__(
        self, dataset: IterableDataset, batch_size: int, rank: int, world_size: int, split: str, limit: int = 0
    ) -> None:
        self.dataset = dataset
        self.limit = limit  # --eval-batches: the stream's first `limit` items; 0: all of them
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.split = split

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        first, size, batches, batch = None, 0, 0, []
        items = itertools.islice(self.dataset, self.limit) if self.limit else self.dataset
        for position, item in enumerate(items):
            first = item if first is None else first
            size = position + 1
            if position % self.world_size == self.rank:
                batch.append(item)
            if len(batch) == self.batch_size:
                if batches % workers == worker_id:
                    yield {"padding": False, "items": batch}
                batches, batch = batches + 1, []
        if batch:
            if batches % workers == worker_id:
                yield {"padding": False, "items": batch}
            batches += 1
        if first is None:
            raise DataError(f"data.py: the {self.split} stream is empty")
        longest_shard = -(-size // self.world_size)
        for index in range(batches, -(-longest_shard // self.batch_size)):
            if index % workers == worker_id:
                yield {"padding": True, "items": [first]}

    @staticmethod
    def collater(collate: Callable[[list[Any]], Any]) -> Callable[[Any], dict[str, Any]]:
        """The DataLoader's collate_fn: the batch's items made into a batch, with its padding flag and size."""

        def collate_batch(element: dict[str, Any]) -> dict[str, Any]:
            items = element["items"]
            return {"padding": element["padding"], "samples": len(items), "batch": collate(items)}

        return collate_batch


def _next_item(items: Iterator[Any], seed: int, epoch: int, position: int) -> Any:
    """The stream's next item, computed with the CPU generators seeded for its position; END after the last."""
    seed_generators(sample_seeds(seed, epoch, [position])[0])
    return next(items, END)
