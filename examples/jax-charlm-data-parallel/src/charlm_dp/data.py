"""Your data: the train, validation and test splits.

This file is yours: `copier update` keeps your edits here.
Python functions from the standard library's own source files (this interpreter's), one function per
sample, as bytes: on every machine, nothing to download. Every function is padded to --max-bytes, so
each batch has one shape and the update compiles once.
"""

import ast
import random
import sysconfig
from pathlib import Path

import numpy as np

from .kit.config import TrainConfig

VOCAB_SIZE = 256  # one token per byte
SPLIT_SEED = 0  # fixed, not --seed: every run and every process must hold out the same functions
SKIPPED = {"test", "site-packages", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip", "pydoc_data"}


def build_datasets(config: TrainConfig) -> tuple[dict[str, np.ndarray], ...]:
    """Return the (train, validation, test) splits: functions and methods of the standard library.

    Each split is a dict of arrays, one row per function: `input_ids` (bytes 0..n-2), `labels` (bytes
    1..n-1) and `mask` (1 where a label is a real byte, 0 on the padding). Every process reads the same
    files in the same order, so every process holds the same splits.
    """
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
                if 48 <= len(text) <= config.max_bytes:
                    texts.append(text)
    random.Random(SPLIT_SEED).shuffle(texts)
    held_out = config.eval_functions
    val, test, train = texts[:held_out], texts[held_out : 2 * held_out], texts[2 * held_out :]
    return padded(train[: config.train_functions or None], config), padded(val, config), padded(test, config)


def padded(texts: list[bytes], config: TrainConfig) -> dict[str, np.ndarray]:
    """The functions as rows of --max-bytes - 1 positions: each byte predicts the next; padding weighs 0."""
    length = config.max_bytes - 1
    rows = {name: np.zeros((len(texts), length), np.int32) for name in ("input_ids", "labels")}
    mask = np.zeros((len(texts), length), np.float32)
    for row, text in enumerate(texts):
        tokens = np.frombuffer(text, np.uint8)
        rows["input_ids"][row, : len(text) - 1] = tokens[:-1]
        rows["labels"][row, : len(text) - 1] = tokens[1:]
        mask[row, : len(text) - 1] = 1.0
    return {**rows, "mask": mask}
