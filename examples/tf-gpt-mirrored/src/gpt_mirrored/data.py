"""Your data: windows of one long token array, as nanoGPT reads them.

This file is yours: `copier update` keeps your edits here.
The corpus is the standard library's own source text, one token per byte, read once per process:
nothing to download. A sample is a window's offset: the loop shuffles, splits and counts offsets
(8 bytes each), and make_batches turns each batch of offsets into its windows.
"""

import functools
import sysconfig
from pathlib import Path

import numpy as np
import tensorflow as tf

from .kit.config import TrainConfig

VOCAB_SIZE = 257  # a token per byte (1..256); loss.py's label 0 (padding) never occurs in a window
CONTEXT = 64  # tokens a window gives the model (nanoGPT's block_size); its labels are the next 64


@functools.cache
def corpus() -> tf.Tensor:
    """The standard library's top-level modules (sorted: the same array on every machine) as tokens."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = b"\n".join(path.read_bytes() for path in sorted(stdlib.glob("*.py")))
    return tf.constant(np.frombuffer(text, np.uint8).astype(np.int32) + 1)


def offsets(first: int, end: int) -> tf.data.Dataset:
    """The windows of tokens first .. end - 1, one sample per offset (a window takes CONTEXT + 1 tokens)."""
    return tf.data.Dataset.range(first, end - CONTEXT)


def build_datasets(config: TrainConfig) -> tuple[tf.data.Dataset, tf.data.Dataset, None]:
    """The corpus's first 90% (of its first --corpus-bytes) trains, the rest validates; no test set, as in
    nanoGPT (the summary gives the best validation figures)."""
    size = min(config.corpus_bytes or len(corpus()), len(corpus()))
    cut = size * 9 // 10
    return offsets(0, cut), offsets(cut, size), None


def make_batches(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """Each batch of offsets becomes its windows: inputs tokens[i : i + 64], labels one token further."""
    positions = tf.range(CONTEXT + 1, dtype=tf.int64)

    def windows(starts: tf.Tensor) -> dict[str, tf.Tensor]:
        tokens = tf.gather(corpus(), starts[:, None] + positions)
        return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}

    return dataset.batch(batch_size).map(windows)
