"""Sharded checkpoints: under FSDP on several ranks, every rank writes its own part of the weights,
optimizer states and moving average. Managed by the looptpl template.

A sharded checkpoint is a folder (`epoch-NNNN.dcp`) written with torch.distributed.checkpoint
(DCP): one `__R_0.distcp` file per rank R with that rank's shards, DCP's `.metadata` (a pickle:
resume only from folders your own runs wrote), `trainer.pt`, which rank 0 writes with
everything else (counters, schedules, data position, every rank's RNG state), and, written last,
`manifest.json`: each file's size and SHA-256, which every read checks first. No rank ever holds
the whole model, so saving costs each rank only its part of the memory and of the write time, and
the ranks write in parallel. DCP reshards on load: a folder written by 8 ranks resumes on 4, or on
one process, which loads the whole model.

`python -m <package>.consolidate` turns such a folder into one file, for inference or export.
"""

import hashlib
import json
import os
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor

from . import files
from .errors import CheckpointError

SUFFIX = ".dcp"
TRAINER_FILE = "trainer.pt"
MANIFEST = "manifest.json"
SHARDED = "<sharded>"  # stands in trainer.pt for a tensor that DCP holds


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP split the model's parameters across the ranks (DTensors)."""
    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def split(tree: Any) -> tuple[dict[str, Any], Any]:
    """The sharded tensors of a nested dict (for DCP) and the rest (for trainer.pt), with SHARDED
    where each sharded tensor was.

    Tensors that are not sharded (buffers, step counters) stay with the rest: rank 0's copy is kept.
    """
    if isinstance(tree, DTensor):
        return {"": tree}, SHARDED
    if not isinstance(tree, dict):
        return {}, tree
    shards, rest = {}, {}
    for key, value in tree.items():
        inner, rest[key] = split(value)
        if inner:
            shards[key] = inner.get("", inner)  # "": a tensor, not a dict of them
    return shards, rest


def pick(rest: Any, like: Any) -> Any:
    """From `like`, a state of the same shape, the tensors at the places SHARDED marks in `rest`:
    the tensors DCP loads into, in this run's own sharding."""
    if isinstance(rest, str) and rest == SHARDED:
        return like
    if not isinstance(rest, dict):
        return None
    picked = {key: pick(value, like[key]) for key, value in rest.items() if _holds_shards(value)}
    return picked


def merge(rest: Any, shards: Any) -> Any:
    """`rest` with the loaded tensors put back where SHARDED marks them."""
    if isinstance(rest, str) and rest == SHARDED:
        return shards
    if not isinstance(rest, dict):
        return rest
    return {key: merge(value, shards[key]) if _holds_shards(value) else value for key, value in rest.items()}


def save(shards: dict[str, Any], folder: Path) -> None:
    """Every rank writes its shards into `folder` (every rank must call this); rank 0 writes DCP's
    metadata after all ranks have written theirs."""
    dcp.save(shards, checkpoint_id=folder)


def save_in_background(shards: dict[str, Any], folder: Path, group: dist.ProcessGroup) -> Future:
    """Like `save`, but here each rank only copies its shards to host memory: a thread writes them,
    with DCP's collectives in `group`, and the Future says when (every rank must call this)."""
    written = dcp.async_save(shards, checkpoint_id=folder, process_group=group)
    # (DCP returns an AsyncSaveResponse only for a stager that copies in the background too.)
    return written if isinstance(written, Future) else written.upload_completion


def load(rest: Any, like: Any, folder: Path) -> Any:
    """The checkpoint in `folder` whose trainer.pt holds `rest`, resharded like `like` (every rank
    must call this)."""
    shards = pick(rest, like)
    dcp.load(shards, checkpoint_id=folder)
    return merge(rest, shards)


def read_trainer(folder: Path) -> dict[str, Any]:
    return files.load(folder / TRAINER_FILE)


def seal(folder: Path, rank: int, world_size: int) -> None:
    """Write the manifest of a folder every rank has finished writing into (every rank must call this).

    Each rank hashes the files it wrote, so that hashing costs each rank only its share of the
    checkpoint; rank 0 writes the manifest.
    """
    mine = [path.name for path in folder.iterdir() if path.name.startswith(f"__{rank}_")]
    if rank == 0:
        mine += [name for name in (".metadata", TRAINER_FILE) if (folder / name).exists()]
    digests: list[dict[str, Any] | None] = [None] * world_size
    dist.all_gather_object(digests, {name: _digest(folder / name) for name in mine})
    if rank == 0:
        manifest = {name: entry for part in digests for name, entry in (part or {}).items()}
        written = files.temporary(folder / MANIFEST)
        with written.open("w") as file:
            json.dump(manifest, file, indent=1, sort_keys=True)
            file.flush()
            os.fsync(file.fileno())
        os.replace(written, folder / MANIFEST)


def check(folder: Path, rank: int = 0, world_size: int = 1) -> str:
    """Why the folder is damaged, in words, or "" when its files are as the manifest says.

    Each rank hashes its share of the files (every rank must call this, and combine the answers).
    A folder without a manifest was written by an older template: it is read unchecked.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as error:
        return f"its {MANIFEST} is unreadable ({error})"
    present = {path.name for path in folder.iterdir()} - {MANIFEST}
    if present != set(manifest):
        return f"it does not hold the files its {MANIFEST} lists ({', '.join(sorted(present ^ set(manifest)))})"
    for name in sorted(manifest)[rank::world_size]:
        if _digest(folder / name) != manifest[name]:
            return f"its {name} is damaged: it does not match the checksum written with it"
    return ""


def _digest(path: Path) -> dict[str, Any]:
    """A file's size and SHA-256."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def load_whole(folder: Path) -> dict[str, Any]:
    """A sharded checkpoint as one dict of whole tensors on the CPU, in this one process (no other
    rank takes part): what a checkpoint file written by one process holds."""
    problem = check(folder)
    if problem:
        raise CheckpointError(problem)
    rest = read_trainer(folder)
    stored = FileSystemReader(folder).read_metadata().state_dict_metadata
    like = _empty_like_stored(rest, stored, prefix="")
    shards = pick(rest, like)
    with warnings.catch_warnings():  # that it loads in one process is the point
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(shards, checkpoint_id=folder, no_dist=True)
    return merge(rest, shards)


def _empty_like_stored(rest: Any, stored: dict[str, Any], prefix: str) -> Any:
    """Empty whole tensors for the SHARDED places of `rest`, sized as the checkpoint stored them
    (DCP names a nested entry by its keys joined with dots)."""
    if isinstance(rest, str) and rest == SHARDED:
        item = stored[prefix]
        if not isinstance(item, TensorStorageMetadata):
            raise ValueError(f"{prefix} is not a tensor in the checkpoint")
        return torch.empty(item.size, dtype=item.properties.dtype)
    if not isinstance(rest, dict):
        return None
    return {key: _empty_like_stored(value, stored, f"{prefix}.{key}".lstrip(".")) for key, value in rest.items()}


def _holds_shards(tree: Any) -> bool:
    if isinstance(tree, str):
        return tree == SHARDED
    return isinstance(tree, dict) and any(_holds_shards(value) for value in tree.values())
