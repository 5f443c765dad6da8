"""Checkpoint files on disk, written so that a crash never leaves half of one.

Managed by the looptpl template.
"""

import os
import shutil
from pathlib import Path
from typing import Any

import torch


def save(payload: dict[str, Any], path: Path) -> None:
    """Write to a temporary file, flush it to disk, then rename: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    try:
        with temporary.open("wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)  # after a failure, leave no partial file behind


def link_best(source: Path, target: Path) -> None:
    """Point `target` (best.pt or best.dcp) at a checkpoint's data without copying it (hard links
    where possible); the best checkpoint of the other kind, from a run on another number of ranks, goes."""
    temporary = target.with_name(target.name + ".tmp")
    remove(temporary)
    if source.is_dir():
        temporary.mkdir()
        for file in source.iterdir():
            _link(file, temporary / file.name)
    else:
        _link(source, temporary)
    for old in (target.with_suffix(".pt"), target.with_suffix(".dcp")):
        remove(old)
    os.replace(temporary, target)


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
