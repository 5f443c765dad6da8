"""Your data: the train, validation and test datasets, and how their items become batches.

This file is yours: `copier update` keeps your edits here.
Python functions from the standard library's own source files (this interpreter's), one function
per sample, as bytes: on every machine, nothing to download. Samples have different lengths and are padded per batch.
"""

import ast
import random
import sysconfig
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from .kit.config import TrainConfig

VOCAB_SIZE = 256  # one token per byte
IGNORE = -100  # the label of a padding position: no loss, no weight
SPLIT_SEED = 0  # fixed, not --seed: every run and every rank must hold out the same functions
SKIPPED = {"test", "site-packages", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip", "pydoc_data"}


class Functions(Dataset):
    """Byte strings; item i is {"bytes": LongTensor of its bytes}."""

    def __init__(self, texts: list[bytes]) -> None:
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"bytes": torch.tensor(list(self.texts[index]), dtype=torch.long)}


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset]:
    """Return the (train, validation, test) datasets: functions and methods of the standard library.

    Every rank reads the same files in the same order, so every rank holds the same splits.
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
    return Functions(train[: config.train_functions or None]), Functions(val), Functions(test)


def collate(items: list[Any]) -> Any:
    """Pad a list of functions into one batch: inputs are bytes 0..n-2, labels bytes 1..n-1.

    Padding positions get the label IGNORE, so they add nothing to the loss or its weight.
    """
    longest = max(len(item["bytes"]) for item in items)
    inputs = torch.zeros(len(items), longest - 1, dtype=torch.long)
    labels = torch.full((len(items), longest - 1), IGNORE, dtype=torch.long)
    for row, item in enumerate(items):
        text = item["bytes"]
        inputs[row, : len(text) - 1] = text[:-1]
        labels[row, : len(text) - 1] = text[1:]
    return {"input_ids": inputs, "labels": labels}
