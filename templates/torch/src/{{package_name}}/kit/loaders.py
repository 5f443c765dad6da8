"""A rank's DataLoaders: its share of each split, on the device. Managed by the looptpl template.

data.py's datasets are map-style (a length and an index: sampling.py picks the samples) or
streams (an IterableDataset: streaming.py cuts them). Either way the loop asks for the
micro-batches of the next update and for the batches of an evaluation, and gets them on the
device; an error in data.py names its file and line.
"""

import atexit
import collections
import contextlib
import functools
import multiprocessing
import numbers
import os
import reprlib
import signal
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, default_collate

from .. import distributed
from .config import TrainConfig
from .errors import ConfigError, DataError, in_your_code, in_your_files, user_code_error
from .sampling import (
    EvalBatchSampler,
    GlobalBatchSampler,
    IndexedSamples,
    SeededSamples,
    TensorRows,
    evaluated_samples,
)
from .streaming import EvalStream, TrainStream

# Where torch's default_collate is defined: an error that passed through there was raised by it.
DEFAULT_COLLATE_FILE = Path(default_collate.__code__.co_filename)


class Loaders:
    """This rank's loaders of the train, val and test splits (no test loader when data.py has no test set)."""

    def __init__(
        self,
        datasets: tuple[Dataset, Dataset, Dataset | None],
        config: TrainConfig,
        rank: int,
        world_size: int,
        device: torch.device,
        collate: Callable[[list[Any]], Any],
    ) -> None:
        self.device = device
        self.grad_accum_steps = config.grad_accum_steps
        workers = config.num_workers if config.num_workers >= 0 else default_workers(device)
        self.make_loader = functools.partial(
            DataLoader,
            num_workers=workers,
            pin_memory=device.type == "cuda",
            persistent_workers=workers > 0,
            worker_init_fn=WorkerSignals() if workers > 0 else None,
            # Their own generator: starting a loader draws a seed for its workers, which must not come
            # from the global generator that drives dropout (a resumed run starts one more loader).
            generator=torch.Generator(),
        )
        self.collate = checked_collate(collate)
        # With torch's default_collate, a TensorDataset's batch is each tensor indexed at once (sampling.TensorRows).
        self.batched = collate is default_collate
        train, val, test = datasets
        self.sampler: GlobalBatchSampler | None = None
        self.stream: TrainStream | None = None
        if isinstance(train, IterableDataset):
            if not config.max_steps:
                raise ConfigError(
                    "data.py's train set is a stream (an IterableDataset) of unknown length: train it for "
                    "--max-steps updates; passes over the stream follow one another until then"
                )
            if config.steps_per_epoch:
                raise ConfigError(
                    "--steps-per-epoch: data.py's train set is a stream, whose epoch is --max-steps updates; drop "
                    "the flag, or give a map-style Dataset"
                )
            self.stream = TrainStream(train, config, rank, world_size)
            self.updates_per_epoch = config.max_steps  # a streamed run is one epoch of --max-steps updates
            self.train = self.make_loader(self.stream, batch_size=None, collate_fn=self.stream.collater(self.collate))
        else:
            self.sampler = _train_sampler(train, config, rank, world_size)
            self.updates_per_epoch = self.sampler.updates_per_epoch
            self.train = self.map_loader(SeededSamples(train, config.seed, self.rows_of(train)), self.sampler)
        self.val = self._evaluation(val, "val", config, rank, world_size)
        self.test = self._evaluation(test, "test", config, rank, world_size) if test is not None else None

    def start_epoch(self, epoch: int, first: int) -> Iterator[Any]:
        """This rank's updates of `epoch`, from update `first` (a resumed run) on."""
        if self.sampler is not None:
            self.sampler.set_epoch(epoch, first)
        with signals_held():  # the first iter() starts the workers
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
        assert loader is not None, "data.py has no test set: nothing to test"
        with signals_held():  # the first iter() starts the workers
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
        if self.device.type == "cpu":
            return batch  # the loader's batches are on the CPU already
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

    def _evaluation(self, dataset: Dataset, split: str, config: TrainConfig, rank: int, world_size: int) -> DataLoader:
        batch_size = config.eval_batch_size
        limit = config.eval_batches * batch_size  # --eval-batches: the samples evaluated; 0: all
        if isinstance(dataset, IterableDataset):
            stream = EvalStream(dataset, batch_size, rank, world_size, split, limit)
            return self.make_loader(stream, batch_size=None, collate_fn=stream.collater(self.collate))
        samples = evaluated_samples(split_size(dataset, split), limit)
        sampler = EvalBatchSampler(samples, batch_size, rank, world_size)
        return self.map_loader(IndexedSamples(dataset, self.rows_of(dataset)), sampler)

    def rows_of(self, dataset: Dataset) -> TensorRows | None:
        """How to fetch a batch of `dataset` at once, where data.py's collate is torch's own (else None)."""
        return TensorRows.of(dataset) if self.batched else None

    def map_loader(self, samples: SeededSamples | IndexedSamples, sampler: Sampler) -> DataLoader:
        """The loader of a map-style split's batches: made by data.py's collate, or fetched whole (`samples.rows`)."""
        collate = self.collate if samples.rows is None else fetched
        return self.make_loader(samples, batch_sampler=sampler, collate_fn=collate)


def fetched(batch: Any) -> Any:
    """The collate_fn of a batch already made (sampling.TensorRows): it is left as it is."""
    return batch


def _train_sampler(train: Dataset, config: TrainConfig, rank: int, world_size: int) -> GlobalBatchSampler:
    """The sampler of a map-style train set, or a message saying why the set cannot be split so."""
    size = split_size(train, "train")
    if config.global_batch_size > size:
        raise ConfigError(
            f"--global-batch-size {config.global_batch_size} is larger than the train set ({size} samples); "
            "lower it, or add data"
        )
    batches = (config.global_batch_size, config.grad_accum_steps)
    sampler = GlobalBatchSampler(size, *batches, rank, world_size, config.seed, config.steps_per_epoch)
    if sampler.updates_per_epoch == 0:
        raise DataError(
            f"data.py: the train set has {size} samples, too few for one update split over "
            f"{world_size} ranks x {config.grad_accum_steps} micro-steps; lower --global-batch-size or add data"
        )
    return sampler


class WorkerSignals:
    """Leaves Ctrl-C and SIGTERM to the training process: a DataLoader worker's `worker_init_fn`.

    A terminal sends Ctrl-C, and Slurm its SIGTERM, to every process: the training process stops the
    run at its next boundary, with a checkpoint, and needs its workers until then (a worker ended by
    the signal would fail the run there). Once the training process exits, Python ends the workers
    with a SIGTERM and waits for them: from then on a SIGTERM ends a worker, with exit status 0 (torch
    reports a worker killed by a signal as a failure).
    """

    def __init__(self) -> None:
        self.exiting = multiprocessing.Event()  # shared with the workers
        atexit.register(self.exiting.set)  # runs before multiprocessing's own exit handler, registered earlier

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        if hasattr(signal, "pthread_sigmask"):  # held while the worker started (signals_held): take them now
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def on_sigterm(self, signum: int, frame: object) -> None:
        if self.exiting.is_set():
            os._exit(0)


# The signals that stop a run: a worker must not take them before WorkerSignals has set its handlers.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back while DataLoader workers start. torch's worker lets a SIGTERM kill it
    until its worker_init_fn (WorkerSignals) runs: a worker started with them held takes a SIGTERM sent in
    that moment only once its handlers are set, and the training process takes it once the workers started."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks (and no SIGTERM from a scheduler)
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def default_workers(device: torch.device) -> int:
    """--num-workers -1: on a GPU, load batches in up to 4 processes per rank, so that the training
    process only queues GPU work (loading batches of 256 images in it cut a CNN's speed on an H100 to
    0.6x); on the CPU, none: the training threads already use every core."""
    if device.type == "cpu":
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def checked_collate(collate: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """data.py's collate, with its failures named: what in which item (by its index in the dataset)
    default_collate cannot batch, or else the line of data.py that failed."""

    def collate_items(items: list[Any]) -> Any:
        try:
            return collate(items)
        except Exception as error:
            # Only what default_collate received unchanged can be blamed on the items (a collate() of
            # yours that pads them hands it other lists).
            problem = unbatchable(items) if given_to_default_collate(error) is items else ""
            if problem:
                raise DataError(f"data.py: could not collate a batch: {problem}") from None
            places = [(Path(frame.filename), frame.lineno) for frame in traceback.extract_tb(error.__traceback__)]
            where = (in_your_files(places) or ["data.py"])[-1]
            lines = str(error).strip().splitlines()
            message = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
            raise DataError(f"{where}: could not collate {len(items)} items into a batch ({message})") from None

    return collate_items


def given_to_default_collate(error: Exception) -> object:
    """The list that torch's default_collate was called with, where `error` came from it (else None)."""
    frame = error.__traceback__
    while frame is not None and Path(frame.tb_frame.f_code.co_filename) != DEFAULT_COLLATE_FILE:
        frame = frame.tb_next
    return frame.tb_frame.f_locals.get("batch") if frame is not None else None


def unbatchable(items: list[Any]) -> str:
    """What in a batch's items default_collate cannot batch, in words ("" if nothing is found): the
    odd item out, by its index in the dataset where the items carry it (sampling.Samples)."""
    indices = getattr(items, "indices", ())
    if len(indices) == len(items):
        names = [(f"dataset index {index}", f"index {index}") for index in indices]
    else:  # a stream's items: only their place in the batch is known
        names = [(f"position {place} of the batch", f"position {place}") for place in range(len(items))]
    return _odd_field(list(items), "", names)


def _odd_field(values: list[Any], field: str, names: list[tuple[str, str]]) -> str:
    """What keeps default_collate from batching `values`, the `field` of every item: the item unlike the
    most (in type, keys, length or shape), a value it cannot batch, or else the same in a nested field."""
    if not values:
        return ""
    kinds = [_kind(value) for value in values]
    usual = collections.Counter(kinds).most_common(1)[0][0]
    normal = kinds.index(usual)
    odd = next((place for place, kind in enumerate(kinds) if kind != usual), normal)
    subject = f"field {field} of the item at {names[odd][0]}" if field else f"the item at {names[odd][0]}"
    if odd != normal:
        return f"{subject} {_difference(values[odd], values[normal], names[normal][1])}"
    first = values[0]
    if usual[0] == "other":
        return f"{subject} is {_describe(first)}, which default_collate cannot batch; {_fix(first)}"
    fields = first if isinstance(first, Mapping) else range(len(first)) if usual[0] in ("tuple", "list") else ()
    for key in fields:
        problem = _odd_field([value[key] for value in values], f"{field}[{key!r}]", names)
        if problem:
            return problem
    return ""


def _kind(value: Any) -> tuple[Any, ...]:
    """What the items must agree on in a field for default_collate to batch it: its type, and its keys,
    length or shape; ("other", ...) for what it cannot batch."""
    if isinstance(value, Mapping):
        return ("dict", frozenset(value))
    if isinstance(value, str | bytes):
        return ("text",)
    if isinstance(value, tuple | list):
        return ("list" if isinstance(value, list) else "tuple", len(value))
    if isinstance(value, numbers.Number):
        return ("number",)
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape))
    if getattr(getattr(value, "dtype", None), "kind", "") in ("b", "i", "u", "f", "c"):  # a NumPy array of numbers
        return ("array", tuple(value.shape))
    return ("other", type(value), str(getattr(value, "dtype", "")))


def _difference(odd: Any, normal: Any, other: str) -> str:
    """How a field of the odd item differs from that of the item at `other`, and the fix, in words."""
    if isinstance(odd, Mapping) and isinstance(normal, Mapping):
        missing = [key for key in normal if key not in odd]
        if missing:
            return f"has no key {missing[0]!r}, which the item at {other} has; give every item the same keys"
        extra = next(key for key in odd if key not in normal)
        return f"has a key {extra!r} that the item at {other} lacks; give every item the same keys"
    if isinstance(odd, tuple) and isinstance(normal, tuple):
        fields = f"{len(odd)} field{'s' * (len(odd) != 1)}, where the item at {other} has {len(normal)}"
        return f"has {fields}; give every item the same fields"
    pads = "(variable-length sequences) need a collate() in data.py that pads them"
    if isinstance(odd, list) and isinstance(normal, list):
        lengths = f"{len(odd)}, where the item at {other} holds a list of {len(normal)}"
        return f"is a list of {lengths}; lists of different lengths {pads}"
    if type(odd) is type(normal) and hasattr(odd, "shape"):
        shapes = f"{list(odd.shape)}, where the item at {other} has {list(normal.shape)}"
        return f"has shape {shapes}; items of different shapes {pads}"
    text = odd if isinstance(odd, str | bytes) else normal if isinstance(normal, str | bytes) else None
    fix = _fix(text) if text is not None else "give every item the same types"
    return f"is {_describe(odd)}, where the item at {other} holds {_describe(normal)}; {fix}"


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, str | bytes):
        return f"the {'bytes' if isinstance(value, bytes) else 'string'} {reprlib.repr(value)}"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"a NumPy array of {value.dtype}"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _fix(value: Any) -> str:
    """How to give default_collate something it can batch instead of `value`."""
    if value is None:
        return "give it a value, or leave the field out of every item"
    if isinstance(value, str | bytes):
        return "default_collate batches text only where every item holds text: turn it into numbers in data.py"
    if getattr(getattr(value, "dtype", None), "kind", "") in ("U", "S"):
        return "turn the text into numbers in data.py (class indices, token ids)"
    return "turn it into a tensor in data.py, or batch it in a collate() there"


def split_size(dataset: Dataset, split: str) -> int:
    """Length of a map-style split, with a clear error when data.py returned something unusable."""
    length = getattr(type(dataset), "__len__", None)
    if length is None:
        raise DataError(
            f"data.py: the {split} dataset must be a map-style Dataset with a length, or a torch IterableDataset"
        )
    with in_your_code(f"taking the length of the {split} dataset"):
        size = length(dataset)
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
        code = getattr(length, "__code__", None)
        where = in_your_files([(Path(code.co_filename), code.co_firstlineno)]) if code is not None else []
        raise DataError(
            f"{(where or ['data.py'])[0]}: the {split} dataset's __len__ returned {size!r}; it must return its "
            "number of samples, an int of 0 or more"
        )
    if size == 0:
        raise DataError(f"data.py: the {split} dataset is empty")
    return int(size)
