"""Checkpoints: written by rank 0 atomically, read by every rank. Managed by the looptpl template.

A checkpoint holds full (unsharded) model and optimizer states keyed by parameter name, without
any DDP `module.` prefix, so it loads into any strategy and any number of ranks. Files are only
loaded with `weights_only=True`: a checkpoint can hold tensors and plain data, never code.
"""

import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from . import distributed
from .distributed import Runtime
from .errors import CheckpointError

FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
FULL = StateDictOptions(full_state_dict=True)


def rng_state(runtime: Runtime) -> dict[str, torch.Tensor]:
    """This rank's random generators as tensors, so a resumed run draws the same numbers."""
    _, python_state, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "python": torch.tensor(python_state, dtype=torch.int64),
        "python_gauss": torch.tensor([math.nan if gauss_next is None else gauss_next], dtype=torch.float64),
    }
    if runtime.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(runtime.device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], runtime: Runtime) -> None:
    torch.set_rng_state(state["torch"])
    gauss_next = state["python_gauss"].item()
    random.setstate((3, tuple(state["python"].tolist()), None if math.isnan(gauss_next) else gauss_next))
    if "cuda" in state and runtime.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], runtime.device)


class Checkpointer:
    """Saves `epoch-NNNN.pt` after every epoch (and `epoch-NNNN-step-SSSSSSSS.pt` part-way through
    epoch NNNN, after update SSSSSSSS), keeps the newest few, and links the best to `best.pt`.

    The names sort in the order they were written.
    """

    def __init__(self, run_dir: Path, runtime: Runtime, keep: int) -> None:
        self.directory = run_dir / "checkpoints"
        self.runtime = runtime
        self.keep = keep

    def save(
        self,
        model: nn.Module,
        optimizers: list[torch.optim.Optimizer],
        state: dict[str, Any],
        name: str,
        is_best: bool,
        running: dict[str, Any] | None = None,
    ) -> None:
        """Every rank must call this: FSDP gathers the shards, and every rank's RNG state is kept.

        `running`: this rank's running totals of an epoch stopped part-way, kept for every rank.
        """
        model_state, optimizer_state = get_state_dict(model, optimizers, options=FULL_ON_RANK0)
        rng_states = _per_rank(rng_state(self.runtime), self.runtime.world_size)
        problem = ""
        if running is not None:
            running = {**running, "skipped": torch.tensor([running["skipped"]])}
            state = {**state, "running": _per_rank(running, self.runtime.world_size)}
        if self.runtime.is_main:
            payload = {
                **state,
                "model": model_state,
                "optimizer": optimizer_state,
                "rng": rng_states,
                "world_size": self.runtime.world_size,
            }
            path = self.directory / name
            try:
                _atomic_save(payload, path)
            except OSError as error:
                problem = f"could not write {path} ({error.strerror}); older checkpoints are intact, free some space"
            else:
                if is_best:
                    _atomic_link(path, self.directory / "best.pt")
                for old in self.epoch_files()[: -self.keep]:
                    old.unlink()
        # Doubles as a barrier: no rank goes on (or reads a checkpoint) before rank 0 has finished writing.
        if distributed.agree(bool(problem)):
            raise CheckpointError(problem or "rank 0 could not write a checkpoint; see its log")

    def check_free_space(self, model: nn.Module) -> None:
        """Fail before training, not at hour 40, when the run directory cannot hold the checkpoints."""
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        # Weights plus two optimizer moments, for each kept checkpoint, the best one and one being written.
        needed = 3 * weights * (self.keep + 2)
        free = shutil.disk_usage(self.directory.parent).free if self.runtime.is_main else needed
        if distributed.agree(free < needed):
            raise CheckpointError(
                f"{self.directory.parent} has {_size(free)} free, checkpoints need about {_size(needed)}; "
                "free some space or lower --keep-checkpoints"
            )

    def epoch_files(self) -> list[Path]:
        """Checkpoints, oldest first."""
        return sorted(self.directory.glob("epoch-*.pt"))

    def running_totals(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """This rank's running totals of the epoch a checkpoint stopped part-way through.

        On another number of ranks, the first rank takes the sums of all of them: the epoch's
        training loss is still right.
        """
        ranks = checkpoint["running"]
        if checkpoint["world_size"] == self.runtime.world_size:
            mine = ranks[self.runtime.rank]
        else:
            mine = {name: sum(rank[name] for rank in ranks) for name in ranks[0]}
            if not self.runtime.is_main:
                mine = {name: torch.zeros_like(value) for name, value in mine.items()}
        return {"totals": mine["totals"], "window": mine["window"], "skipped": int(mine["skipped"].item())}

    def load_latest(self) -> tuple[Path, dict[str, Any]]:
        """The newest readable checkpoint; a damaged file is reported and skipped."""
        for path in reversed(self.epoch_files()):
            try:
                return path, self.read(path)
            except Exception as error:  # a truncated or corrupt file: fall back to an older one
                if self.runtime.is_main:
                    print(f"warning: skipping unreadable checkpoint {path}: {error}", flush=True)
        raise CheckpointError(
            f"no readable checkpoint in {self.directory} to resume from; drop --resume to start a new run"
        )

    def read(self, path: Path) -> dict[str, Any]:
        return torch.load(path, map_location="cpu", weights_only=True)

    def restore(
        self, path: Path, checkpoint: dict[str, Any], model: nn.Module, optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Load weights, optimizer states and this rank's RNG state from a checkpoint."""
        try:
            set_state_dict(
                model,
                optimizers,
                model_state_dict=checkpoint["model"],
                optim_state_dict=checkpoint["optimizer"],
                options=FULL,
            )
        except (RuntimeError, KeyError, ValueError) as error:
            raise CheckpointError(
                f"{path} does not fit the model and optimizer built by model.py and optim.py ({_first_line(error)}); "
                "resume with the code that wrote it, or start a new --run-dir"
            ) from None
        if checkpoint["world_size"] == self.runtime.world_size:
            set_rng_state(checkpoint["rng"][self.runtime.rank], self.runtime)
        elif self.runtime.is_main:
            print(
                f"warning: checkpoint was written by {checkpoint['world_size']} ranks, this run has "
                f"{self.runtime.world_size}; training continues, but random draws differ from the original run",
                flush=True,
            )

    def load_best(self, model: nn.Module, best_epoch: int) -> tuple[str, dict[str, Any] | None]:
        """Load the best epoch's weights for the final test; which weights were loaded, in words,
        and the best checkpoint (None when the last weights stay).

        A missing or unreadable best.pt leaves the last weights in place, with a warning: the
        run's results are kept either way.
        """
        path = self.directory / "best.pt"
        try:
            checkpoint = self.read(path)
            set_model_state_dict(model, checkpoint["model"], options=FULL)
        except Exception as error:
            if self.runtime.is_main:
                print(f"warning: cannot load {path} ({_first_line(error)}); testing the last weights", flush=True)
            return "last (best.pt unreadable)", None
        return f"best (epoch {best_epoch})", checkpoint


def load_frozen(model: nn.Module, path: str | Path) -> nn.Module:
    """Load weights from `path` into `model` and freeze it: for a model that only predicts (a teacher).

    Accepts a plain state dict, or a checkpoint of a project like this one with one network (its
    "model" entry): a teacher trained by another run, say.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as error:
        raise CheckpointError(f"cannot read frozen weights {path} ({_first_line(error)}); check the path") from None
    state = state.get("model", state)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise CheckpointError(f"{path} does not fit the frozen model ({_first_line(error)})") from None
    return model.requires_grad_(False).eval()


def _per_rank(tensors: dict[str, torch.Tensor], world_size: int) -> list[dict[str, torch.Tensor]]:
    """Every rank's values of these tensors (every rank must call this), as one dict per rank."""
    gathered = {name: distributed.all_gather(value) for name, value in tensors.items()}
    return [{name: values[rank] for name, values in gathered.items()} for rank in range(world_size)]


def _size(count: int) -> str:
    """A byte count in words: 512 bytes, 3.2 MiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _atomic_save(payload: dict[str, Any], path: Path) -> None:
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


def _atomic_link(source: Path, target: Path) -> None:
    """Point `target` at `source`'s data without copying it (a hard link where possible), atomically."""
    temporary = target.with_name(target.name + ".tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
    except OSError:  # a filesystem without hard links: copy instead
        shutil.copyfile(source, temporary)
    os.replace(temporary, target)
