"""Which samples each update and each evaluation batch takes. Managed by the looptpl template.

The order is a function of (--seed, epoch) alone, the same on every process, cut into global batches:
a resumed run, or one on another number of devices or processes, trains on the same batches in the
same order. Every batch has the compiled shape: a short last batch is padded, and its padding rows
count for nothing (kit/collect.py leaves them out of every Mean). A stream (streaming.py) is cut the
same way, in its own order.
"""

from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import numpy as np

from .errors import DataError


def split_size(split: Any) -> int:
    """The samples of a split data.py built: arrays (a tuple or dict of them, one row per sample) or a
    dataset with __len__ and __getitem__."""
    leaves = jax.tree.leaves(split) if isinstance(split, tuple | dict) else []
    if leaves:
        sizes = {len(leaf) for leaf in leaves}
        if len(sizes) != 1:
            raise DataError(f"data.py: a split's arrays must have one row per sample each, got {sorted(sizes)} rows")
        return sizes.pop()
    if hasattr(split, "__len__") and hasattr(split, "__getitem__"):
        return len(split)
    raise DataError(
        f"data.py: a split must be arrays (a tuple or dict of NumPy arrays), a dataset with __len__ and "
        f"__getitem__, or a stream (an object whose __iter__ yields samples), got a {type(split).__name__}"
    )


def take(split: Any, indices: np.ndarray) -> Any:
    """The samples at `indices` (any shape) of a split, stacked: arrays of shape indices.shape + sample's."""
    if isinstance(split, tuple | dict):
        return jax.tree.map(lambda array: np.asarray(array)[indices], split)
    items = [split[int(index)] for index in indices.reshape(-1)]
    return jax.tree.map(lambda *rows: np.stack(rows).reshape(*indices.shape, *np.shape(rows[0])), *items)


class GlobalBatch(NamedTuple):
    """A batch's samples: their indices [micro-steps, rows] in `source` (a split, or a stream's window), which
    rows are samples (1) and which padding (0), how many samples, and the epoch (a stream's pass) whose
    random draws they make."""

    source: Any
    indices: np.ndarray
    rows: np.ndarray
    samples: int
    epoch: int


class TrainOrder:
    """The global batches of each epoch: a shuffle of the train set, cut into --global-batch-size samples,
    each split into --grad-accum-steps micro-batches; the last, short batch is kept, padded. With
    `steps_per_epoch` (--steps-per-epoch), an epoch is the first that many batches of its shuffle."""

    def __init__(
        self, split: Any, global_batch_size: int, grad_accum_steps: int, seed: int, steps_per_epoch: int = 0
    ) -> None:
        self.split, size = split, split_size(split)
        if size < 1:
            raise DataError("data.py: the train set is empty")
        self.size, self.global_batch_size, self.grad_accum_steps = size, global_batch_size, grad_accum_steps
        self.seed = seed
        self.updates_per_epoch = -(-size // global_batch_size)
        if 0 < steps_per_epoch < self.updates_per_epoch:
            self.updates_per_epoch = steps_per_epoch
        self._epoch, self._order = -1, np.arange(0)

    def update(self, epoch: int, update: int) -> GlobalBatch:
        """Update `update` of `epoch`."""
        if epoch != self._epoch:
            self._epoch, self._order = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.size)
        chosen = self._order[update * self.global_batch_size : (update + 1) * self.global_batch_size]
        return GlobalBatch(self.split, *pad(chosen, self.global_batch_size, self.grad_accum_steps), epoch)

    def state_dict(self) -> dict[str, Any]:
        """Nothing to keep: the order is a function of (--seed, epoch), and the checkpoint holds where the run is."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see state_dict)."""


def evaluated(size: int, samples: int) -> np.ndarray:
    """The indices of a split of `size` that its evaluations use: all of them, or (--eval-batches) `samples` of
    them, in dataset order. The subset is drawn by a fixed seed, not --seed: the same samples for every
    evaluation, every number of devices, and runs with other seeds, so their figures compare."""
    if not samples or samples >= size:
        return np.arange(size)
    return np.sort(np.random.default_rng(0).permutation(size)[:samples])


def eval_batches(split: Any, samples: int, batch_size: int, name: str) -> Iterator[GlobalBatch]:
    """The evaluation batches of the split `name` (all of it, or `samples` of it), in dataset order, padded alike."""
    indices = evaluated(split_size(split), samples)
    if not len(indices):
        raise DataError(f"data.py: the {name} split is empty")
    for start in range(0, len(indices), batch_size):
        yield GlobalBatch(split, *pad(indices[start : start + batch_size], batch_size, 1), 0)


def pad(chosen: np.ndarray, length: int, parts: int) -> tuple[np.ndarray, np.ndarray, int]:
    """`chosen` padded to `length` (with its first index, whose rows then count for nothing) and cut into
    `parts` equal rows; the padding is spread over the parts, so each part holds samples."""
    samples = len(chosen)
    per_part = length // parts
    sizes = [samples // parts + (part < samples % parts) for part in range(parts)]
    indices = np.full((parts, per_part), chosen[0], dtype=np.int64)
    rows = np.zeros((parts, per_part), dtype=np.float32)
    start = 0
    for part, size in enumerate(sizes):
        indices[part, :size], rows[part, :size] = chosen[start : start + size], 1.0
        start += size
    return indices, rows, samples
