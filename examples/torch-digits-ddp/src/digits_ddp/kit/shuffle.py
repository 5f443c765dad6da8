"""The order of the train set in an epoch. Managed by the looptpl template.

`torch.randperm(n)` would build the whole permutation before the first batch: 8.6 s and 0.8 GB
at 10^8 samples, again every epoch. `Shuffle` computes the sample at any position on its own, so
the sampler asks only for the positions it is about to use, and a resumed run starts at its
position without computing the ones before.
"""

import random
from typing import Any

import torch


class Shuffle:
    """A random permutation of range(size), one per (seed, epoch), computed for given positions only.

    A Feistel network scrambles a position's bits in rounds, each one XOR-ing one half of the bits
    with a hash of the other half: a one-to-one map of [0, 2^bits). A position it sends past the
    data set's end is scrambled again (cycle walking) until it lands inside, which keeps the map
    one-to-one on range(size): every sample comes exactly once per epoch. Nothing as large as the
    data set is ever held.
    """

    CHUNK = 1 << 16  # positions computed at once: a few milliseconds, half a megabyte
    ROUNDS = 6
    FEW = 128  # positions still walking that walk on in Python, one at a time

    def __init__(self, size: int, seed: int, epoch: int) -> None:
        self.size = size
        bits = max(1, (size - 1).bit_length())  # under twice the data set: few positions walk again
        self.low_bits = bits // 2
        self.masks = ((1 << (bits - self.low_bits)) - 1, (1 << self.low_bits) - 1)  # the high half, the low half
        draw = random.Random(seed * 1_000_003 + epoch)
        self.keys = [draw.getrandbits(31) for _ in range(self.ROUNDS)]

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        """The sample index at each position of the epoch."""
        indices = self._scramble(positions)
        walking = (indices >= self.size).nonzero().flatten()
        # Each walk sends up to half of the rest past the end again. A walk of tensors costs ~0.3 ms however
        # few they hold, one in Python ~6 us a position: the last few positions walk in Python.
        while len(walking) > self.FEW:
            indices[walking] = self._scramble(indices[walking])
            walking = walking[indices[walking] >= self.size]
        if len(walking):
            indices[walking] = torch.tensor([self._walk(index) for index in indices[walking].tolist()])
        return indices

    def _walk(self, index: int) -> int:
        while index >= self.size:
            index = self._scramble(index)
        return index

    def _scramble(self, values: Any) -> Any:
        """One pass of the Feistel network over a tensor of positions, or over one position (an int)."""
        halves = [values >> self.low_bits, values & self.masks[1]]
        for round, key in enumerate(self.keys):
            changed = round % 2
            halves[changed] ^= _mix(halves[1 - changed], key) & self.masks[changed]
        return (halves[0] << self.low_bits) | halves[1]


def _mix(values: Any, key: int) -> Any:
    """A 31-bit integer hash of each value (kept under 2^62 in int64 arithmetic: no overflow), of a tensor or an int."""
    mixed = values ^ key  # a new tensor, changed in place from here on
    mixed *= 0x5BD1E995
    mixed &= 0x7FFFFFFF
    mixed ^= mixed >> 15
    mixed *= 0x27D4EB2D
    mixed &= 0x7FFFFFFF
    mixed ^= mixed >> 13
    return mixed
