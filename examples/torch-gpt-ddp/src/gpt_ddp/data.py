"""Your data: windows of a long token array, as nanoGPT reads them.

This file is yours: `copier update` keeps your edits here.
prepare_data writes the standard library's source text, one token per byte, to train.bin and
val.bin (uint16, like nanoGPT's prepare.py); item i of a split is the window at token i.
"""

import os
import sysconfig
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .kit.config import TrainConfig

VOCAB_SIZE = 256  # one token per byte
IGNORE = -100  # loss.py's label for padding: a window has none


class Windows(Dataset):
    """Every window of `length` tokens of a token file: inputs i .. i + length - 1, labels one further."""

    def __init__(self, path: Path, length: int) -> None:
        self.path, self.length = path, length
        self.size = path.stat().st_size // 2 - length  # uint16 tokens; the last window's labels end the file
        self.tokens: np.ndarray | None = None  # mapped on first use: each DataLoader worker maps its own

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        window = torch.from_numpy(self.tokens[index : index + self.length + 1].astype(np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}


def token_file(config: TrainConfig, split: str) -> Path:
    return Path(config.data_dir) / f"stdlib-{config.corpus_bytes or 'all'}-{split}.bin"


def prepare_data(config: TrainConfig) -> None:
    """Write the corpus once: its first 90% to train.bin, the rest to val.bin."""
    if token_file(config, "val").exists():
        return
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = b"\n".join(path.read_bytes() for path in sorted(stdlib.glob("*.py")))
    tokens = np.frombuffer(text[: config.corpus_bytes or None], dtype=np.uint8).astype(np.uint16)
    cut = len(tokens) * 9 // 10
    for split, part in (("train", tokens[:cut]), ("val", tokens[cut:])):  # val last: it marks both done
        path = token_file(config, split)
        path.parent.mkdir(parents=True, exist_ok=True)
        written = path.with_suffix(f".{os.getpid()}.tmp")  # a name of its own: two runs may prepare at once
        part.tofile(written)
        written.replace(path)  # whole or absent, never half-written


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, None]:
    """Windows of the train and val tokens; no test set, as in nanoGPT (the summary gives the best val)."""
    train, val = (Windows(token_file(config, split), config.max_bytes) for split in ("train", "val"))
    return train, val, None
