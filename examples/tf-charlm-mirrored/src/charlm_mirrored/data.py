"""Your data: the train, validation and test datasets, and how their items become batches.

This file is yours: `copier update` keeps your edits here.
Python functions from the standard library's own source files (this interpreter's), one function
per sample, as bytes: on every machine, nothing to download. Samples have different lengths and
are padded per batch.
"""

import ast
import random
import sysconfig
from pathlib import Path

import numpy as np
import tensorflow as tf

from .kit.config import TrainConfig

VOCAB_SIZE = 257  # one token per byte value (1..256); 0 is the padding
SPLIT_SEED = 0  # fixed, not --seed: every run and every worker must hold out the same functions
SKIPPED = {"test", "site-packages", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip", "pydoc_data"}


def read_functions(max_bytes: int) -> list[bytes]:
    """Every function and method of 48 to `max_bytes` bytes in the standard library, shuffled once."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [*stdlib.glob("*.py"), *stdlib.glob("*/*.py")]
    texts = []
    for path in sorted(file for file in files if file.relative_to(stdlib).parts[0] not in SKIPPED):
        source = path.read_bytes()
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a few files are templates or other Python versions' code
            continue
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                text = b"".join(lines[node.lineno - 1 : node.end_lineno])
                if 48 <= len(text) <= max_bytes:
                    texts.append(text)
    random.Random(SPLIT_SEED).shuffle(texts)
    return texts


def as_dataset(texts: list[bytes]) -> tf.data.Dataset:
    """One sample per function: {"input_ids": bytes 0..n-2, "labels": bytes 1..n-1}, as tokens 1..256."""
    tokens = [np.frombuffer(text, np.uint8).astype(np.int32) + 1 for text in texts]
    spec = {"input_ids": tf.TensorSpec([None], tf.int32), "labels": tf.TensorSpec([None], tf.int32)}
    dataset = tf.data.Dataset.from_generator(
        lambda: ({"input_ids": row[:-1], "labels": row[1:]} for row in tokens), output_signature=spec
    )
    return dataset.apply(tf.data.experimental.assert_cardinality(len(tokens)))


def build_datasets(config: TrainConfig) -> tuple[tf.data.Dataset, tf.data.Dataset, tf.data.Dataset]:
    """Return the (train, validation, test) datasets: functions and methods of the standard library.

    Every worker reads the same files in the same order, so every worker holds the same splits.
    """
    texts = read_functions(config.max_bytes)
    held_out = config.eval_functions
    val, test, train = texts[:held_out], texts[held_out : 2 * held_out], texts[2 * held_out :]
    return as_dataset(train[: config.train_functions or None]), as_dataset(val), as_dataset(test)


def make_batches(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """Pad each batch to its longest function with 0: label 0 marks the positions without a loss."""
    return dataset.padded_batch(batch_size)
