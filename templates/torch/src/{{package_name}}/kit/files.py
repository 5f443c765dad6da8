"""Checkpoint files on disk, written so that a crash never leaves half of one, and read back exactly
or refused. Managed by the looptpl template.
"""

import ctypes
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from .. import distributed
from .errors import CheckpointError


def temporary(path: Path) -> Path:
    """Where `path` is written before it is renamed into place: `path` with `.tmp` added."""
    return path.with_name(path.name + ".tmp")


CHECKSUM = "checksum"  # the key of a file's checksum, beside the content it covers


def save(payload: dict[str, Any], path: Path, checksum: bool = True) -> None:
    """Write to a temporary file, flush it to disk, then rename: a crash never leaves half a file.

    The file holds a checksum of its content too, which `load` checks (`checksum=False` for a file
    other programs read, such as a plain state dict).
    """
    if checksum:
        payload = {**payload, CHECKSUM: content_checksum(payload)}
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


def load(path: Path) -> Any:
    """A file `save` wrote, read back exactly as it was written, or a CheckpointError.

    A file without a checksum (a state dict from elsewhere, or a checkpoint of an older template)
    is read as it is.
    """
    content = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(content, dict) and CHECKSUM in content:
        written = content.pop(CHECKSUM)
        if content_checksum(content) != written:
            raise CheckpointError(f"{path.name} is damaged: its content does not match the checksum written with it")
    return content


def content_checksum(tree: Any) -> str:
    """The SHA-256 of a checkpoint's content: every tensor's type, shape and bytes, and every other
    value, in order. A bit flipped on disk anywhere in a file changes it."""
    digest = hashlib.sha256()
    _feed(tree, digest)
    return "sha256:" + digest.hexdigest()


def _feed(value: Any, digest: "hashlib._Hash") -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
        digest.update(f"tensor {tensor.dtype} {list(tensor.shape)};".encode())
        if tensor.numel():  # its memory, read in place: no copy, and no numpy
            digest.update((ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr()))
    elif isinstance(value, dict):
        digest.update(f"dict {len(value)};".encode())
        for key, item in value.items():
            digest.update(f"{key!r}:".encode())
            _feed(item, digest)
    elif isinstance(value, list | tuple):
        digest.update(f"{type(value).__name__} {len(value)};".encode())
        for item in value:
            _feed(item, digest)
    else:
        digest.update(f"{type(value).__name__} {value!r};".encode())


def link_best(source: Path, target: Path) -> None:
    """Point `target` (`best` with the checkpoint's suffix) at a checkpoint's data without copying it
    (hard links where possible); a best checkpoint of another kind (another suffix) goes."""
    linked = temporary(target)
    remove(linked)
    if source.is_dir():
        linked.mkdir()
        for file in source.iterdir():
            _link(file, linked / file.name)
    else:
        _link(source, linked)
    for old in target.parent.glob(target.stem + ".*"):
        if old.name != linked.name:
            remove(old)
    os.replace(linked, target)


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # a filesystem without hard links: copy instead
        shutil.copyfile(source, target)


def move_aside(path: Path, folder: Path) -> None:
    """Move a damaged checkpoint file or folder into `folder`, kept for a look, under a name that no
    earlier one there has."""
    folder.mkdir(exist_ok=True)
    target, number = folder / path.name, 1
    while target.exists():
        target, number = folder / f"{path.name}.{number}", number + 1
    os.replace(path, target)


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
