"""Which samples of a map-style data set each rank sees. Managed by the looptpl template: edit data.py instead.

Training: every epoch one seeded permutation, identical on all ranks, is cut into global batches
(with --steps-per-epoch, only its first ones: each epoch a different part of a large train set);
each global batch is split into `world_size * grad_accum_steps` micro-batches and each rank takes
its own. The union over ranks and micro-steps is exactly the global batch that a single process
would see, so N ranks train like 1 rank with the same global batch. A run resumed part-way through
an epoch starts at the global batch where it stopped. The permutation (shuffle.py) is computed a
few thousand positions at a time, so a train set of 10^8 samples starts as quickly as a small one.

Random draws in data.py (augmentation) are seeded per sample, from --seed, the epoch and the
sample's index: a sample gets the same draws whatever the number of ranks and DataLoader workers,
and after a resume, and new ones every epoch. Only the generators data.py is seen to draw from are
seeded, so a data set without random draws pays nothing for it.

Evaluation: rank r takes samples r, r + N, r + 2N, ... of the split (of its --eval-batches subset,
drawn once in `evaluated_samples`). A rank whose shard needs one batch fewer runs a padding batch,
so every rank runs the same number of batches (a forward can be a collective every rank must join);
its values are dropped, so every sample counts exactly once.
"""

import _random
import contextlib
import ctypes
import functools
import itertools
import random
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils.data import ConcatDataset, Dataset, Sampler, Subset, TensorDataset

from .shuffle import Shuffle

try:  # data.py may draw from NumPy's global generator: it is seeded per sample too
    import numpy
except ImportError:
    numpy = None  # type: ignore[assignment]


class MicroBatch(list[int]):
    """The dataset indices of a micro-batch of the train set, and the epoch they are drawn in: SeededSamples
    seeds each sample's random draws from both. `tensor` holds the same indices for TensorRows to index with
    (making one again from the list took 6 us of the 53 that a batch of 64 took to fetch)."""

    def __init__(self, indices: torch.Tensor, epoch: int) -> None:
        super().__init__(indices.tolist())
        self.epoch = epoch
        self.tensor = indices

    def __reduce__(self) -> tuple[Any, ...]:
        # To a DataLoader worker as the list and the epoch: a tensor would be sent through shared memory.
        return _micro_batch, (list(self), self.epoch)


def _micro_batch(indices: list[int], epoch: int) -> MicroBatch:
    return MicroBatch(torch.tensor(indices, dtype=torch.long), epoch)


class GlobalBatchSampler(Sampler[MicroBatch]):
    """Yields this rank's micro-batches of indices, `grad_accum_steps` per optimizer update."""

    def __init__(
        self,
        dataset_size: int,
        global_batch_size: int,
        grad_accum_steps: int,
        rank: int,
        world_size: int,
        seed: int,
        steps_per_epoch: int = 0,
    ) -> None:
        self.dataset_size = dataset_size
        self.global_batch_size = global_batch_size
        self.splits = world_size * grad_accum_steps
        self.grad_accum_steps = grad_accum_steps
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        self.start = 0  # global batches of this epoch already trained on (a resumed run)
        # A short last global batch is kept if every micro-batch gets at least one sample.
        full, rest = divmod(dataset_size, global_batch_size)
        self.updates_per_epoch = full + (1 if rest >= self.splits else 0)
        self.samples_per_epoch = full * global_batch_size + (rest if rest >= self.splits else 0)
        if 0 < steps_per_epoch < self.updates_per_epoch:  # --steps-per-epoch: the first updates of each epoch's order
            self.updates_per_epoch, self.samples_per_epoch = steps_per_epoch, steps_per_epoch * global_batch_size

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Reshuffle: each epoch has its own permutation, the same on every rank. A resumed epoch skips
        its first `start` global batches."""
        self.epoch, self.start = epoch, start

    def samples_between(self, first: int, end: int) -> int:
        """Samples in the global batches `first` to `end - 1` of an epoch (only the last one may be short)."""
        return min(end * self.global_batch_size, self.samples_per_epoch) - first * self.global_batch_size

    def __iter__(self) -> Iterator[MicroBatch]:
        shuffle = Shuffle(self.dataset_size, self.seed, self.epoch)
        size = self.global_batch_size
        per_chunk = max(1, Shuffle.CHUNK // size)  # global batches whose indices are computed together
        for first in range(self.start, self.updates_per_epoch, per_chunk):
            positions = torch.arange(first * size, min((first + per_chunk) * size, self.samples_per_epoch))
            order = shuffle(positions)
            for start in range(0, len(order), size):
                batch = order[start : start + size]
                # Near-equal parts (the longer first), so a short last batch is spread evenly.
                parts = batch.tensor_split(self.splits) if self.splits > 1 else (batch,)
                for micro_step in range(self.grad_accum_steps):
                    yield MicroBatch(parts[micro_step * self.world_size + self.rank], self.epoch)

    def __len__(self) -> int:
        return (self.updates_per_epoch - self.start) * self.grad_accum_steps


def split_evenly(items: list[Any], parts: int) -> list[list[Any]]:
    """Consecutive parts whose sizes differ by at most one, the longer first (as torch.tensor_split cuts)."""
    if parts == 1:
        return [items]
    bounds = [0, *itertools.accumulate(part_sizes(len(items), parts))]
    return [items[bounds[part] : bounds[part + 1]] for part in range(parts)]


def part_sizes(total: int, parts: int) -> list[int]:
    """The sizes of split_evenly's parts of `total` items."""
    size, extra = divmod(total, parts)
    return [size + (part < extra) for part in range(parts)]


def rank_share(samples: int, world_size: int, micro_steps: int, rank: int) -> int:
    """This rank's samples of a global batch of `samples`, as the train samplers cut it (split_evenly into
    micro_steps x world_size parts; micro-step m of rank r takes part m * world_size + r)."""
    return sum(part_sizes(samples, world_size * micro_steps)[rank::world_size])


class Samples(list[Any]):
    """The items of a batch, as the dataset gave them, with their indices in it: collate receives this list,
    and an item it cannot batch is named by its index."""

    def __init__(self, items: Iterable[Any], indices: Sequence[int] = ()) -> None:
        super().__init__(items)
        self.indices = indices


class TensorRows:
    """The batches of torch's TensorDataset (or a Subset of one, as random_split makes), each fetched at once.

    What default_collate makes of a batch's rows, each tensor's rows stacked in a list, is each tensor
    indexed by the batch's indices: one index per tensor instead of a row per tensor and sample and a
    stack (the default project's data path: 42 us a batch of 64 in place of 255). The loop takes it when
    data.py keeps torch's default_collate; a collate of yours receives the items one by one, as before.
    """

    def __init__(self, tensors: tuple[torch.Tensor, ...], indices: torch.Tensor | None = None) -> None:
        self.tensors = tensors
        self.indices = indices  # a Subset's: which rows of the tensors its items are

    @classmethod
    def of(cls, dataset: Dataset) -> "TensorRows | None":
        """For a TensorDataset of torch's, or a Subset of one; None for any other data set."""
        if type(dataset).__getitem__ is Subset.__getitem__ and isinstance(dataset, Subset):
            inner = cls.of(dataset.dataset)
            if inner is None or inner.indices is not None:
                return None
            return cls(inner.tensors, torch.as_tensor(dataset.indices, dtype=torch.long))
        if type(dataset).__getitem__ is TensorDataset.__getitem__ and isinstance(dataset, TensorDataset):
            return cls(dataset.tensors)
        return None

    def __call__(self, indices: list[int]) -> list[torch.Tensor]:
        rows = indices.tensor if isinstance(indices, MicroBatch) else torch.tensor(indices, dtype=torch.long)
        if self.indices is not None:
            rows = self.indices[rows]
        return [tensor[rows] for tensor in self.tensors]


class SeededSamples(Dataset):
    """data.py's train set, each sample loaded with random generators seeded from (--seed, epoch, index).

    A DataLoader worker's generators would otherwise depend on which worker loads a sample and on
    what it loaded before: a resumed run, or another --num-workers, would augment differently.
    The caller's generators are restored after each batch (with no workers, torch's drives
    dropout on the CPU). Only CPU generators are seeded: data.py runs on the CPU, and a GPU's
    generator, which drives dropout there, is left alone.

    Seeding three generators for every sample costs more than loading a small one, so only the
    generators data.py draws from are seeded. A batch is loaded seeding those seen so far; if it
    moved another generator, it is loaded again with that one seeded too, and so are all that follow.
    Watching the generators costs ~35 us a batch in the loop; torch's own data sets that only index tensors
    (TensorDataset, and Subset or ConcatDataset of those) draw nothing, so they are not watched.
    """

    def __init__(self, dataset: Dataset, seed: int, rows: TensorRows | None = None) -> None:
        self.dataset = dataset
        self.seed = seed
        self.rows = rows  # a batch of torch's tensors, indexed at once (Loaders: data.py keeps default_collate)
        self.seeded: set[str] = set()  # the generators data.py was seen to draw from
        self.draws = not draws_nothing(dataset)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitems__(self, batch: MicroBatch) -> Any:
        """A batch (the DataLoader asks for whole batches): fetched at once where `rows` can, else sample by sample."""
        return self.rows(batch) if self.rows is not None else self.load(batch)

    def load(self, batch: MicroBatch) -> Samples:
        """The samples of a batch, each loaded with the generators data.py draws from seeded for it."""
        if not self.draws:
            return Samples([self.dataset[index] for index in batch], batch)
        callers = generator_states()
        try:
            while True:
                items = self._load(batch) if self.seeded else [self.dataset[index] for index in batch]
                drawn = moved_since(callers, GENERATORS - self.seeded)
                if not drawn:  # then seeding the others would have changed nothing
                    restore_generators(callers, self.seeded)  # the others are as they were
                    return Samples(items, batch)
                self.seeded |= drawn
        except BaseException:
            restore_generators(callers, GENERATORS)
            raise

    def _load(self, batch: MicroBatch) -> list[Any]:
        """The samples, each loaded with the generators in `self.seeded` seeded for it."""
        # One generator (the usual case) is seeded by a direct call: ~20 us a batch less than a loop over names.
        if len(self.seeded) == 1:
            seed = CPU_GENERATORS[next(iter(self.seeded))].seed
        else:
            seed = functools.partial(seed_generators, names=self.seeded)
        items = []
        for index, sample_seed in zip(batch, sample_seeds(self.seed, batch.epoch, batch), strict=True):
            seed(sample_seed)
            items.append(self.dataset[index])
        return items


def draws_nothing(dataset: Dataset) -> bool:
    """Whether loading from `dataset` surely draws no random number: one of torch's data sets that only
    index tensors (TensorDataset, with its own __getitem__), or a Subset or ConcatDataset of those."""
    kind = type(dataset)
    if kind.__getitem__ is TensorDataset.__getitem__:
        return True
    if kind.__getitem__ is Subset.__getitem__ and isinstance(dataset, Subset):
        return draws_nothing(dataset.dataset)
    if kind.__getitem__ is ConcatDataset.__getitem__ and isinstance(dataset, ConcatDataset):
        return all(draws_nothing(part) for part in dataset.datasets)
    return False


class IndexedSamples(Dataset):
    """An evaluation set whose batches of items carry their dataset indices, as SeededSamples' do."""

    def __init__(self, dataset: Dataset, rows: TensorRows | None = None) -> None:
        self.dataset = dataset
        self.rows = rows  # as SeededSamples' rows

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> Any:
        """The samples of a batch, fetched together where data.py's dataset can (its own __getitems__)."""
        if self.rows is not None:
            return self.rows(indices)
        fetch = getattr(self.dataset, "__getitems__", None)
        items = fetch(indices) if fetch is not None else [self.dataset[index] for index in indices]
        return Samples(items, indices) if isinstance(items, list) else items


class TwisterState:
    """A global Mersenne Twister's state (NumPy's, Python's), taken again only when it may have changed.

    Taking it copies the generator (NumPy's get_state() 60 us, Python's getstate() 9 us: as long as
    loading a small sample, and SeededSamples needs it twice a batch). The twister's position and first
    keys are read in place instead, through a view of them made once per generator (checked once against
    the state taken, else never used). A draw moves the position, and the keys are all remade every 624
    draws, so while the position and the first 8 keys have not changed (a chance of 2^-256 to miss a draw)
    and its cached Gaussian has not either (a draw of that one moves nothing else), the state is the one
    taken last. Watching Python's and NumPy's so costs ~35 us a batch in the loop; a ctypes.memmove of all
    2,500 bytes at each read cost more (its call machinery is cold after a batch of samples).
    """

    KEYS = 8  # the keys read

    def __init__(self) -> None:
        self.state: Any = None
        self.twister = b""  # the position and first keys `state` has
        self.owner: Any = None  # the object holding the generator `views` show, kept so that it lives while viewed
        self.views: Any = None  # ctypes arrays over its position and first keys; None where they cannot be read so

    def get(self) -> Any:
        twister = self.read_twister()
        if twister is None or twister != self.twister or self.gaussian_changed(self.state):
            self.state = self.take()
            self.twister = twister or b""
        return self.state

    def set(self, state: Any) -> None:
        """Set the generator to `state`, which `get` then returns while it does not move. (A state set another
        way with the same keys and position but another cached Gaussian would not be seen: set it here.)"""
        self.put(state)
        twister = self.read_twister()
        if twister is not None:
            self.state, self.twister = state, twister

    def read_twister(self) -> bytes | None:
        """The generator's position and first keys as they are now; None where they cannot be read so."""
        owner = self.current_owner()
        if owner is not self.owner:  # the first read, or NumPy's generator replaced (set_bit_generator)
            self.owner, self.views = owner, self.views_of(owner) if owner is not None else None
            if self.views is not None and self.read(self.views) != self.twister_of(self.take()):
                self.views = None  # laid out otherwise than this reads them: take the state every time
        return self.read(self.views) if self.views is not None else None

    def current_owner(self) -> Any:
        raise NotImplementedError

    def views_of(self, owner: Any) -> Any:
        raise NotImplementedError

    def read(self, views: Any) -> bytes:
        raise NotImplementedError

    def twister_of(self, state: Any) -> bytes:
        """The position and first keys of a state, as `read` reads them."""
        raise NotImplementedError

    def take(self) -> Any:
        raise NotImplementedError

    def put(self, state: Any) -> None:
        raise NotImplementedError

    def gaussian_changed(self, state: Any) -> bool:
        raise NotImplementedError


class NumpyState(TwisterState):
    """`numpy.random.get_state()`: ("MT19937", keys, position, has_gauss, cached_gaussian)."""

    def current_owner(self) -> Any:
        generator = _numpy_bit_generator() if _numpy_bit_generator else None
        return generator if type(generator) is numpy.random.MT19937 else None  # else set_bit_generator chose another

    def views_of(self, owner: Any) -> Any:
        address = int(owner.ctypes.state_address)  # NumPy's ctypes interface: 624 uint32 keys, then an int position
        position = (ctypes.c_char * 4).from_address(address + 624 * 4)
        return position, (ctypes.c_char * (4 * self.KEYS)).from_address(address)

    def read(self, views: Any) -> bytes:
        position, keys = views
        return position.raw + keys.raw  # type: ignore[no-any-return]

    def twister_of(self, state: Any) -> bytes:
        position = int(state[2]).to_bytes(4, "little", signed=True)
        return position + state[1][: self.KEYS].astype("<u4").tobytes()  # type: ignore[no-any-return]

    def take(self) -> Any:
        return numpy.random.get_state()

    def put(self, state: Any) -> None:
        numpy.random.set_state(state)

    def gaussian_changed(self, state: Any) -> bool:
        return bool(state[3])  # a Gaussian was cached when the state was taken: it may have been drawn since


class PythonState(TwisterState):
    """`random.getstate()`: (version, (its 624 keys..., position), cached Gaussian)."""

    def current_owner(self) -> Any:
        return random.getstate.__self__ if _PYTHON_TWISTER_IN_PLACE else None  # type: ignore[attr-defined]

    def views_of(self, owner: Any) -> Any:
        return (ctypes.c_char * (4 + 4 * self.KEYS)).from_address(id(owner) + object.__basicsize__)

    def read(self, views: Any) -> bytes:
        return views.raw  # type: ignore[no-any-return]

    def twister_of(self, state: Any) -> bytes:
        keys = state[1]
        return struct.pack(f"=i{self.KEYS}I", keys[-1], *keys[: self.KEYS])

    def take(self) -> Any:
        return random.getstate()

    def put(self, state: Any) -> None:
        random.setstate(state)

    def gaussian_changed(self, state: Any) -> bool:
        return state[2] != random.getstate.__self__.gauss_next  # type: ignore[attr-defined, no-any-return]


# NumPy >= 1.25 tells which generator numpy.random draws from; CPython's _random.Random keeps
# `int index; uint32_t state[624]` right after the object header.
_numpy_bit_generator = getattr(numpy.random, "get_bit_generator", None) if numpy else None
_PYTHON_TWISTER_IN_PLACE = _random.Random.__basicsize__ >= object.__basicsize__ + 4 + 624 * 4
_numpy_state = NumpyState()  # one per process (a DataLoader worker has its own)
_python_state = PythonState()  # one per process


def same_python_state(left: Any, right: Any) -> bool:
    """Whether two of Python's states, (version, its 624 keys and position, cached Gaussian), are one: a draw
    moves the position, and the keys are all remade every 624 draws, so equal positions and first keys mean
    no draw (a chance of 2^-256)."""
    keys = TwisterState.KEYS
    return left is right or (left[1][-1] == right[1][-1] and left[2] == right[2] and left[1][:keys] == right[1][:keys])


def same_numpy_state(left: Any, right: Any) -> bool:
    """Whether two of NumPy's states, ("MT19937", keys as an array, position, has_gauss, cached_gaussian), are one."""
    return left is right or (bool((left[1] == right[1]).all()) and left[2:] == right[2:])


class CpuGenerator(NamedTuple):
    """A CPU generator data.py may draw from: how to read its state, seed it for a sample, set a state
    back, and tell two states apart (two the same: no draw between them)."""

    read: Callable[[], Any]
    seed: Callable[[int], object]
    restore: Callable[[Any], object]
    same: Callable[[Any, Any], bool]


# torch.default_generator.manual_seed, not torch.manual_seed: that one also seeds every GPU, 100x slower.
CPU_GENERATORS = {
    "torch": CpuGenerator(torch.get_rng_state, torch.default_generator.manual_seed, torch.set_rng_state, torch.equal),
    "python": CpuGenerator(_python_state.get, random.seed, _python_state.set, same_python_state),
}
if numpy:
    CPU_GENERATORS["numpy"] = CpuGenerator(_numpy_state.get, numpy.random.seed, _numpy_state.set, same_numpy_state)
GENERATORS = frozenset(CPU_GENERATORS)


def generator_states(names: Iterable[str] = GENERATORS) -> dict[str, Any]:
    """The states of the CPU generators `names`; by default of all data.py may draw from (torch, Python, NumPy)."""
    return {name: CPU_GENERATORS[name].read() for name in names}


def restore_generators(states: dict[str, Any], names: Iterable[str]) -> None:
    """Set the generators `names` back to `states`."""
    for name in names:
        CPU_GENERATORS[name].restore(states[name])


def seed_generators(sample_seed: int, names: Iterable[str] = GENERATORS) -> None:
    """Seed the CPU generators `names` (all that data.py may draw from) with a sample's seed (sample_seeds)."""
    for name in names:
        CPU_GENERATORS[name].seed(sample_seed)


@contextlib.contextmanager
def callers_generators_kept() -> Iterator[None]:
    """Restore torch's CPU generator, Python's and NumPy's afterwards: with no DataLoader workers
    they drive dropout and the like in the training process."""
    states = generator_states()
    try:
        yield
    finally:
        restore_generators(states, GENERATORS)


def moved_since(states: dict[str, Any], names: Iterable[str]) -> set[str]:
    """Those of the generators `names` that drew since they had `states`."""
    now = generator_states(names)
    return {name for name in names if not CPU_GENERATORS[name].same(now[name], states[name])}


def sample_seeds(seed: int, epoch: int, positions: Iterable[int]) -> list[int]:
    """The seeds of the samples at `positions` of `epoch`, 32 bits each: torch's CPU generator and NumPy's
    use no more of a seed. Two positions of an epoch (below 2^32) never get the same seed, nor does one
    position in two epochs: the position, XOR-ed with a key of --seed and the epoch, times an odd number."""
    key = _mix32((seed * 1_000_003 + epoch) & 0xFFFFFFFF)
    return [((position ^ key) * 0x9E3779B1) & 0xFFFFFFFF for position in positions]


def _mix32(value: int) -> int:
    """MurmurHash3's finalizer: a one-to-one scramble of the 32-bit integers."""
    value = ((value ^ (value >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    value = ((value ^ (value >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return value ^ (value >> 16)


def evaluated_samples(size: int, samples: int) -> Sequence[int]:
    """The indices of a split that its evaluations use: all `size` of them, or (--eval-batches) `samples`
    of them, in dataset order. The subset is drawn by a fixed seed, not --seed: the same samples for
    every evaluation, every number of ranks, and runs with other seeds, so their figures compare."""
    if not samples or samples >= size:
        return range(size)
    return sorted(Shuffle(size, seed=0, epoch=0)(torch.arange(samples)).tolist())


class EvalBatchSampler(Sampler[list[int]]):
    """Rank r's share of the samples an evaluation uses, samples[r], samples[r + N], ..., in batches.

    Every rank runs as many batches as the rank with the most: one short of that gets a padding
    batch (a repeated sample) after its `real_batches`, whose values the loop drops.
    """

    def __init__(self, samples: Sequence[int], batch_size: int, rank: int, world_size: int) -> None:
        self.batch_size = batch_size
        self.shard = samples[rank::world_size]  # a range stays a range: no list of a large split is built
        self.real_size = len(self.shard)
        self.real_batches = -(-self.real_size // batch_size)
        self.batches = -(-len(samples[::world_size]) // batch_size)  # the longest shard's
        self.padding = [samples[0]]

    def __iter__(self) -> Iterator[list[int]]:
        for start in range(0, self.real_size, self.batch_size):
            yield list(self.shard[start : start + self.batch_size])
        for _ in range(self.batches - self.real_batches):
            yield self.padding

    def __len__(self) -> int:
        return self.batches
