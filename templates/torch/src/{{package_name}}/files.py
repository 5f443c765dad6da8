"""Checkpoint files on disk, written so that a crash never leaves half of one.

Managed by the looptpl template.
"""

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from . import distributed
from .errors import CheckpointError


def temporary(path: Path) -> Path:
    """Where `path` is written before it is renamed into place: `path` with `.tmp` added."""
    return path.with_name(path.name + ".tmp")


def save(payload: dict[str, Any], path: Path) -> None:
    """Write to a temporary file, flush it to disk, then rename: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = temporary(path)
    try:
        with written.open("wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(written, path)
    finally:
        written.unlink(missing_ok=True)  # after a failure, leave no partial file behind


def link_best(source: Path, target: Path) -> None:
    """Point `target` (best.pt or best.dcp) at a checkpoint's data without copying it (hard links
    where possible); the best checkpoint of the other kind, from a run on another number of ranks, goes."""
    linked = temporary(target)
    remove(linked)
    if source.is_dir():
        linked.mkdir()
        for file in source.iterdir():
            _link(file, linked / file.name)
    else:
        _link(source, linked)
    for old in (target.with_suffix(".pt"), target.with_suffix(".dcp")):
        remove(old)
    os.replace(linked, target)


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # a filesystem without hard links: copy instead
        shutil.copyfile(source, target)


def remove(path: Path) -> None:
    """Delete a checkpoint file or folder, if it is there."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def check_free_space(directory: Path, needed: int, is_main: bool) -> None:
    """Fail on every rank alike when `directory` (as rank 0 sees it) has fewer than `needed` bytes free."""
    free = shutil.disk_usage(directory).free if is_main else needed
    if distributed.agree(free < needed):
        raise CheckpointError(
            f"{directory} has {_in_words(free)} free, checkpoints need about {_in_words(needed)}; "
            "free some space or lower --keep-checkpoints"
        )


def _in_words(count: int) -> str:
    """A byte count in words: 512 bytes, 3.2 MiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"
