"""A rank's DataLoaders: its share of each split, on the device. Managed by the looptpl template.

data.py's datasets are map-style (a length and an index: sampling.py picks the samples) or
streams (an IterableDataset: streaming.py cuts them). Either way the engine asks for the
micro-batches of the next update and for the batches of an evaluation, and gets them on the
device; an error in data.py names its file and line.
"""

import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from . import data, distributed
from .config import TrainConfig
from .errors import ConfigError, DataError, user_code_error
from .sampling import EvalBatchSampler, GlobalBatchSampler, SeededSamples
from .streaming import EvalStream, TrainStream


class Loaders:
    """This rank's loaders of the train, val and test splits."""

    def __init__(
        self,
        datasets: tuple[Dataset, Dataset, Dataset],
        config: TrainConfig,
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        self.device = device
        self.grad_accum_steps = config.grad_accum_steps
        workers = config.num_workers if config.num_workers >= 0 else default_workers(device)
        self.make_loader = functools.partial(
            DataLoader,
            num_workers=workers,
            pin_memory=device.type == "cuda",
            persistent_workers=workers > 0,
            # Their own generator: starting a loader draws a seed for its workers, which must not come
            # from the global generator that drives dropout (a resumed run starts one more loader).
            generator=torch.Generator(),
        )
        self.collate = _checked(getattr(data, "collate", default_collate))
        train, val, test = datasets
        self.sampler: GlobalBatchSampler | None = None
        self.stream: TrainStream | None = None
        if isinstance(train, IterableDataset):
            if not config.max_steps:
                raise ConfigError(
                    "data.py's train set is a stream (an IterableDataset) of unknown length: train it for "
                    "--max-steps updates; passes over the stream follow one another until then"
                )
            self.stream = TrainStream(train, config, rank, world_size)
            self.updates_per_epoch = config.max_steps  # a streamed run is one epoch of --max-steps updates
            self.train = self.make_loader(self.stream, batch_size=None, collate_fn=self.stream.collater(self.collate))
        else:
            self.sampler = _train_sampler(train, config, rank, world_size)
            self.updates_per_epoch = self.sampler.updates_per_epoch
            self.train = self.make_loader(
                SeededSamples(train, config.seed), batch_sampler=self.sampler, collate_fn=self.collate
            )
        self.val = self._evaluation(val, "val", config.eval_batch_size, rank, world_size)
        self.test = self._evaluation(test, "test", config.eval_batch_size, rank, world_size)

    def start_epoch(self, epoch: int, first: int) -> Iterator[Any]:
        """This rank's updates of `epoch`, from update `first` (a resumed run) on."""
        if self.sampler is not None:
            self.sampler.set_epoch(epoch, first)
        return iter(self.train)

    def next_update(self, updates: Iterator[Any], update: int) -> tuple[list[Any], int]:
        """This rank's micro-batches of update `update` of the epoch, on the device, and the samples
        of its global batch (all ranks)."""
        if self.stream is not None:
            element = self._next(updates)
            self.stream.start = element["position"]  # where a checkpoint written after this update goes on
            return [self.to_device(batch) for batch in element["micro_batches"]], element["samples"]
        assert self.sampler is not None
        micro_batches = [self.to_device(self._next(updates)) for _ in range(self.grad_accum_steps)]
        return micro_batches, self.sampler.samples_between(update, update + 1)

    def check_streams_agree(self, updates: int) -> None:
        """With a stream, check that every rank is at the same place of it (every rank must call this).

        Every rank reads the whole stream, so all are in the same pass at the same update; streams of
        different lengths would make the ranks train on different passes, unnoticed. One tiny all-gather,
        at log points only.
        """
        if self.stream is None:
            return
        places = distributed.all_gather(torch.tensor(self.stream.start))
        if any(not torch.equal(place, places[0]) for place in places):
            raise DataError(
                f"data.py: the ranks' train streams have passes of different lengths (seen at update {updates}); "
                "every rank must read the same items in the same order: do not shard the stream in data.py"
            )

    def state_dict(self) -> dict[str, Any]:
        """Where in the stream a resumed run goes on (for a map-style set, the epoch and update say it)."""
        return {"stream_position": list(self.stream.start)} if self.stream is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.stream is not None and "stream_position" in state:
            self.stream.start = tuple(state["stream_position"])

    def evaluation_batches(self, split: str) -> Iterator[tuple[Any, bool, int]]:
        """The batches of `split` ("val", "test") on this rank, on the device: (batch, padding, samples)."""
        loader = self.val if split == "val" else self.test
        batches = iter(loader)
        if isinstance(loader.dataset, EvalStream):
            while (element := self._next(batches)) is not None:
                yield self.to_device(element["batch"]), element["padding"], element["samples"]
            return
        sampler = loader.batch_sampler
        assert isinstance(sampler, EvalBatchSampler)
        for index in range(len(sampler)):
            padding = index >= sampler.real_batches
            samples = 0 if padding else min(sampler.batch_size, sampler.real_size - index * sampler.batch_size)
            yield self.to_device(self._next(batches)), padding, samples

    def to_device(self, batch: Any) -> Any:
        """Move every tensor of a batch (nested in tuples, lists and dicts) to the device, without waiting."""
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, dict):
            return {key: self.to_device(value) for key, value in batch.items()}
        if isinstance(batch, list | tuple):
            moved = [self.to_device(value) for value in batch]
            return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
        return batch

    def _next(self, batches: Iterator[Any]) -> Any:
        """The loader's next element, None after the last; an error in data.py names its file and line."""
        try:
            return next(batches, None)
        except Exception as error:
            raise user_code_error(error, "loading a batch") from None

    def _evaluation(self, dataset: Dataset, split: str, batch_size: int, rank: int, world_size: int) -> DataLoader:
        if isinstance(dataset, IterableDataset):
            stream = EvalStream(dataset, batch_size, rank, world_size, split)
            return self.make_loader(stream, batch_size=None, collate_fn=stream.collater(self.collate))
        sampler = EvalBatchSampler(split_size(dataset, split), batch_size, rank, world_size)
        return self.make_loader(dataset, batch_sampler=sampler, collate_fn=self.collate)


def _train_sampler(train: Dataset, config: TrainConfig, rank: int, world_size: int) -> GlobalBatchSampler:
    """The sampler of a map-style train set, or a message saying why the set cannot be split so."""
    size = split_size(train, "train")
    if config.global_batch_size > size:
        raise DataError(
            f"--global-batch-size {config.global_batch_size} is larger than the train set ({size} samples); "
            "lower it, or add data"
        )
    sampler = GlobalBatchSampler(size, config.global_batch_size, config.grad_accum_steps, rank, world_size, config.seed)
    if sampler.updates_per_epoch == 0:
        raise DataError(
            f"data.py: the train set has {size} samples, too few for one update split over "
            f"{world_size} ranks x {config.grad_accum_steps} micro-steps; lower --global-batch-size or add data"
        )
    return sampler


def default_workers(device: torch.device) -> int:
    """--num-workers -1: on a GPU, load batches in up to 4 processes per rank, so that the training
    process only queues GPU work (loading batches of 256 images in it cut a CNN's speed on an H100 to
    0.6x); on the CPU, none: the training threads already use every core."""
    if device.type == "cpu":
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def _checked(collate: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """data.py's collate, with its failures named: items of different shapes are the usual one."""

    def collate_items(items: list[Any]) -> Any:
        try:
            return collate(items)
        except Exception as error:
            message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise DataError(
                f"data.py: could not collate {len(items)} items into a batch ({message}); items of different "
                "shapes (variable-length sequences) need a collate() in data.py that pads them"
            ) from None

    return collate_items


def split_size(dataset: Dataset, split: str) -> int:
    """Length of a map-style split, with a clear error when data.py returned something unusable."""
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise DataError(
            f"data.py: the {split} dataset must be a map-style Dataset with a length, or a torch IterableDataset"
        ) from None
    if size == 0:
        raise DataError(f"data.py: the {split} dataset is empty")
    return size
