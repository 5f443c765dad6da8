"""Streams: a split that data.py gives as an iterable of samples without a length.

Managed by the looptpl template: edit data.py instead.

Every process reads the whole stream, in the order data.py yields it, and loads its own rows of each
batch, so data.py must yield the same samples in the same order in every process, and must not shard.

Training: the stream's consecutive samples are cut into global batches of --global-batch-size (a pass's
short last batch padded, as an epoch's is), so any number of devices and processes trains on the same
batches. A stream has no length: the run is one epoch of --max-steps updates, and when the stream ends
the next pass starts (data.py's `set_epoch(n)`, if the stream has one, can reorder pass n). A sample's
random draws (`kit.api.dropout`) come from (--seed, its pass, its place in the pass). A resumed run
reads its pass again up to where it stopped and goes on exactly.

Evaluation: the stream's samples (with --eval-batches, its first ones), in order, each counted once.
"""

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from .config import TrainConfig
from .errors import ConfigError, DataError
from .sampling import GlobalBatch, pad


def is_stream(split: Any) -> bool:
    """Whether a split data.py built is a stream: iterable, without a length (arrays and datasets have one)."""
    return not isinstance(split, tuple | dict) and hasattr(split, "__iter__") and not hasattr(split, "__len__")


def read(stream: Any, name: str) -> Iterator[Any]:
    """A new pass over the split `name`, a stream: it must start again at each pass and evaluation, which an
    iterator (a generator's output) cannot."""
    samples = iter(stream)
    if samples is stream:
        raise DataError(
            f"data.py: the {name} split is an iterator, which can be read once; return an object whose __iter__ "
            "starts the stream again (a class with an __iter__ method)"
        )
    return samples


class Window:
    """The samples of one global batch of a stream, found by their place in its pass."""

    def __init__(self, first: int, samples: list[Any]) -> None:
        self.first, self.samples = first, samples

    def __getitem__(self, place: int) -> Any:
        return self.samples[place - self.first]


class TrainStream:
    """The global batches of a train stream, read in order from where the run is (`position`)."""

    def __init__(self, stream: Any, config: TrainConfig) -> None:
        if not config.max_steps:
            raise ConfigError(
                "data.py's train set is a stream (an iterable without a length): train it for --max-steps updates; "
                "passes over the stream follow one another until then"
            )
        if config.steps_per_epoch:
            raise ConfigError(
                "--steps-per-epoch: data.py's train set is a stream, whose epoch is --max-steps updates; drop the "
                "flag, or give data.py's train set a length"
            )
        self.stream, self.size, self.updates_per_epoch = stream, None, config.max_steps
        self.global_batch_size, self.grad_accum_steps = config.global_batch_size, config.grad_accum_steps
        self.position = (0, 0)  # (pass, global batches of it trained on): where the next update reads
        # The pass being read, from `position`: the first pass, until a resumed run says where it goes on.
        self._samples: Iterator[Any] | None = self._read(0, skip=0)

    def update(self, epoch: int, update: int) -> GlobalBatch:
        """The next global batch (`epoch` and `update` count the run's updates; the stream reads in order)."""
        size = self.global_batch_size
        passed, done = self.position
        if self._samples is None:  # the first update of a resumed run: read up to where it stopped
            self._samples = self._read(passed, skip=done * size)
        batch = list(itertools.islice(self._samples, size))
        if not batch:  # the pass has ended: the next one starts
            passed, done = passed + 1, 0
            self._samples = self._read(passed, skip=0)
            batch = list(itertools.islice(self._samples, size))
            if not batch:
                raise DataError(
                    f"data.py: pass {passed} over the train stream gave no sample; its __iter__ must yield the "
                    "samples again for every pass"
                )
        self.position = (passed, done + 1)
        places = np.arange(done * size, done * size + len(batch))  # in the pass
        return GlobalBatch(Window(done * size, batch), *pad(places, size, self.grad_accum_steps), passed)

    def place(self) -> int:
        """Where the stream is, (pass, global batches of it done), as one number: every process's must be alike."""
        return self.position[0] * 2**31 + self.position[1]

    @staticmethod
    def out_of_step(updates: int) -> DataError:
        """The error when the processes are at different places of the stream after `updates` updates."""
        return DataError(
            f"data.py: the processes' train streams have passes of different lengths (seen at update {updates}); "
            "every process must read the same samples in the same order: do not shard the stream in data.py"
        )

    def _read(self, passed: int, skip: int) -> Iterator[Any]:
        """Pass `passed` over the stream, from its sample `skip` on."""
        if hasattr(self.stream, "set_epoch"):
            self.stream.set_epoch(passed)
        return itertools.islice(read(self.stream, "train"), skip, None)

    def state_dict(self) -> dict[str, Any]:
        """Where a resumed run goes on: the pass, and the global batches of it trained on."""
        return {"stream_position": list(self.position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position, self._samples = tuple(state["stream_position"]), None


def stream_eval_batches(stream: Any, samples: int, batch_size: int, name: str) -> Iterator[GlobalBatch]:
    """The evaluation batches of a stream (all of it, or its first `samples`), in order, padded alike."""
    used = itertools.islice(read(stream, name), samples or None)
    first = 0
    while batch := list(itertools.islice(used, batch_size)):
        places = np.arange(first, first + len(batch))
        yield GlobalBatch(Window(first, batch), *pad(places, batch_size, 1), 0)
        first += len(batch)
    if not first:
        raise DataError(f"data.py: the {name} stream is empty")
