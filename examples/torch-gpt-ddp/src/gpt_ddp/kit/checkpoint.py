"""Checkpoints: written atomically, read by every rank. Managed by the looptpl template.

A checkpoint holds the model and optimizer states keyed by parameter name, without any DDP
`module.` prefix, so it loads into any strategy and any number of ranks. Rank 0 writes it as one
file of whole tensors. Files are only loaded with `weights_only=True`: a checkpoint file can hold
tensors and plain data, never code.
"""

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from .. import distributed
from ..distributed import Runtime
from . import files, rng
from .config import TrainConfig
from .contract import template_version
from .errors import CheckpointError

if TYPE_CHECKING:
    from .ema import WeightAverage

FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, gathered on rank 0
FULL = StateDictOptions(full_state_dict=True)  # whole tensors on every rank


class Checkpointer:
    """Saves `epoch-NNNN` after every epoch (and `epoch-NNNN-step-SSSSSSSS` part-way through epoch
    NNNN, after update SSSSSSSS), keeps the newest few, and links the best to `best`.

    A checkpoint is one file (`.pt`) written by rank 0; it resumes on any number of ranks. The names
    sort in the order they were written.

    In the background (--async-checkpoints), `save` takes a copy of the state in host memory and a
    thread writes it while training goes on; the rename that makes it a checkpoint, the best link
    and the rotation wait for `finish`, which the next save, the final test and train.py call.
    """

    def __init__(
        self,
        run_dir: Path,
        runtime: Runtime,
        config: TrainConfig,
        model: nn.Module,
        optimizers: list[torch.optim.Optimizer],
        ema: "WeightAverage | None",
    ) -> None:
        self.directory = run_dir / "checkpoints"
        self.runtime = runtime
        self.keep = config.keep_checkpoints
        self.model, self.optimizers, self.ema = model, optimizers, ema
        self.in_background = config.async_checkpoints
        self.template = template_version()  # recorded in each checkpoint, named if a later version cannot read it
        self.writer = ThreadPoolExecutor(max_workers=1) if self.in_background else None  # rank 0 writes in it
        self.writing: tuple[Future | None, Path, bool] | None = None  # a save in progress: its folder, is_best

    def save(self, state: dict[str, Any], name: str, is_best: bool, running: dict[str, Any] | None = None) -> None:
        """Every rank must call this: every rank's RNG state is kept.

        `running`: this rank's running totals of the epoch in progress, kept for every rank.
        """
        self.finish()  # one save at a time
        payload = {**state, **self.weights(FULL_ON_RANK0)}
        payload["format"] = FORMAT
        payload["template"] = self.template
        payload["rng"] = _per_rank(rng.state(self.runtime), self.runtime.world_size)
        payload["world_size"] = self.runtime.world_size
        if running is not None:
            running = {**running, "skipped": torch.tensor([running["skipped"]])}
            payload["running"] = _per_rank(running, self.runtime.world_size)
        path = self.directory / (name + ".pt")
        written: Future | None
        try:
            written = self.write_file(payload, path)
        except OSError as error:
            written = Future()
            written.set_exception(error)  # `finish` reports it
        self.writing = (written, path, is_best)
        if not self.in_background:
            self.finish()

    def finish(self) -> None:
        """Complete the save in progress, if any, once written: link the best checkpoint, drop the
        oldest; or fail on every rank. Every rank must call this."""
        if self.writing is None:
            return
        written, path, is_best = self.writing
        self.writing = None
        problem = ""
        try:
            if written is not None:
                written.result()
        except OSError as error:
            problem = f"could not write {path} ({first_line(error)}); older checkpoints are intact, free some space"
        if self.runtime.is_main and not problem:
            if is_best:
                files.link_best(path, self.directory / ("best" + path.suffix))
            for old in self.checkpoints()[: -self.keep]:
                files.remove(old)
        # Doubles as a barrier: no rank goes on (or reads a checkpoint) before rank 0 has finished writing.
        if distributed.agree(bool(problem)):
            raise CheckpointError(problem or "rank 0 could not write a checkpoint; see its log")

    def write_file(self, payload: dict[str, Any], path: Path) -> Future | None:
        """Rank 0 writes the checkpoint file; in the background, a copy of it (training goes on changing
        the weights), returning the writing's Future."""
        if not self.runtime.is_main:
            return None
        if self.writer is not None:
            return self.writer.submit(files.save, copy.deepcopy(payload), path)
        files.save(payload, path)
        return None

    def weights(self, options: StateDictOptions, with_optimizers: bool = True) -> dict[str, Any]:
        """The model's state, the optimizers' and the moving average's, as a checkpoint holds them."""
        state: dict[str, Any] = {"model": get_model_state_dict(self.model, options=options)}
        if with_optimizers:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizers, options=options)
        if self.ema is not None:
            state["ema"] = self.ema.state_dict(options)
        return state

    def check_free_space(self) -> None:
        """Fail before training, not at hour 40, when the run directory cannot hold the checkpoints."""
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        # Weights plus two optimizer moments, for each kept checkpoint, the best one and one being written.
        files.check_free_space(self.directory.parent, 3 * weights * (self.keep + 2), self.runtime.is_main)

    def checkpoints(self) -> list[Path]:
        return checkpoints_in(self.directory)

    def running_totals(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """This rank's running totals of the epoch a checkpoint was written in.

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
        """The newest checkpoint that reads back exactly (every rank must call this).

        A damaged one (truncated, or a bit changed on disk) is reported and moved to
        `checkpoints/damaged/`, where it stays for a look, and an older one is used; the run then
        writes that checkpoint anew when it gets there.
        """
        found: tuple[Path, dict[str, Any]] | None = None
        damaged = []
        for path in reversed(self.checkpoints()):
            problem = ""
            try:
                checkpoint = self.read(path)
            except Exception as error:  # a truncated or corrupt one: fall back to an older one
                problem = first_line(error)
            # Every rank must resume from the same checkpoint: one that any rank cannot read is skipped by all.
            if not distributed.any_rank(bool(problem))[0]:
                found = path, checkpoint
                break
            damaged.append(path)
            if self.runtime.is_main:
                reason = problem or "unreadable on another rank"
                print(f"warning: skipping unreadable checkpoint {path} ({reason}); moved to damaged/", flush=True)
        distributed.barrier()  # every rank is done with the damaged ones before they move
        if self.runtime.is_main:
            for path in damaged:
                files.move_aside(path, self.directory / "damaged")
        if found is None:
            raise CheckpointError(
                f"no readable checkpoint in {self.directory} to resume from (the damaged ones are in "
                f"{self.directory / 'damaged'}); start a new run in another --run-dir"
            )
        check_format(*found)
        return found

    def read(self, path: Path, with_optimizers: bool = True) -> dict[str, Any]:
        """A checkpoint, exactly as it was written, or a CheckpointError."""
        return files.load(path)

    def restore(self, path: Path, checkpoint: dict[str, Any]) -> None:
        """Load weights, optimizer states, the moving average and this rank's RNG state from a checkpoint."""
        try:
            set_state_dict(
                self.model,
                self.optimizers,
                model_state_dict=checkpoint["model"],
                optim_state_dict=checkpoint["optimizer"],
                options=options_for(checkpoint["model"]),
            )
            if self.ema is not None:
                self.ema.load_state_dict(checkpoint["ema"])
        except (RuntimeError, KeyError, ValueError) as error:
            raise CheckpointError(
                f"{path} does not fit the model and optimizer built by model.py and optim.py ({first_line(error)}); "
                "resume with the code that wrote it, or start a new --run-dir"
            ) from None
        if checkpoint["world_size"] == self.runtime.world_size:
            rng.restore(checkpoint["rng"][self.runtime.rank], self.runtime)
        elif self.runtime.is_main:
            print(
                f"warning: checkpoint was written by {checkpoint['world_size']} ranks, this run has "
                f"{self.runtime.world_size}; training continues, but random draws differ from the original run",
                flush=True,
            )

    def load_best(self, best_epoch: int) -> str:
        """Load the best epoch's weights (and moving average) for the final test; which weights
        were loaded, in words.

        A missing or unreadable best checkpoint leaves the last weights in place, with a warning:
        the run's results are kept either way.
        """
        self.finish()
        path = self.directory / "best.pt"
        try:
            checkpoint = self.read(path, with_optimizers=False)
            set_model_state_dict(self.model, checkpoint["model"], options=options_for(checkpoint["model"]))
            if self.ema is not None:
                self.ema.load_state_dict(checkpoint["ema"])
        except Exception as error:
            if self.runtime.is_main:
                print(f"warning: cannot load {path} ({first_line(error)}); testing the last weights", flush=True)
            return f"last ({path.name} unreadable)"
        return f"best (epoch {best_epoch})"


# What a checkpoint of this template holds besides what each run adds (data, hooks): a checkpoint that
# lacks any of it was written by an older template version, whose run this loop cannot continue.
FORMAT = 1  # written into each checkpoint; raised when what the loop reads back changes
HOLDS: tuple[str, ...] = ("model", "optimizer", "rng", "world_size", "config", "epoch", "step", "early_stopping")
HOLDS += ("schedulers", "scalers")  # stages.py's part


def check_format(path: Path, checkpoint: dict[str, Any]) -> None:
    """Refuse, in one line, a checkpoint of another template version's format (not your files' fault)."""
    written = checkpoint.get("format", FORMAT)  # those written before the number had it were format 1 or older
    # Checkpoints record the template version that wrote them since format 1; older ones say nothing.
    version = f"template version {checkpoint['template']}" if checkpoint.get("template") else None
    if written > FORMAT:
        raise CheckpointError(
            f"{path} was written by {version or 'a newer version of the template'} (checkpoint format {written}, "
            f"this loop reads {FORMAT}); update this project (looptpl update) to resume it"
        )
    lacks = [key for key in HOLDS if key not in checkpoint]
    if lacks or written < FORMAT:
        held = f"it holds no {', '.join(lacks)}" if lacks else f"checkpoint format {written}, this loop reads {FORMAT}"
        raise CheckpointError(
            f"{path} was written by {version or 'an older version of the template'} ({held}), whose runs this "
            "loop cannot continue; finish the run with the template version that wrote it (git log -- "
            ".copier-answers.yml), or start a new --run-dir"
        )


def checkpoints_in(directory: Path) -> list[Path]:
    """The checkpoints in `directory`, oldest first (`epoch-0002-step-00000020` sorts before `epoch-0002`)."""
    found = list(directory.glob("epoch-*.pt"))
    return sorted(found, key=lambda path: path.stem + ".")


def options_for(state: dict[str, Any]) -> StateDictOptions:
    """How to load a model state: whole tensors, which every rank holds."""
    return FULL


def load_frozen(model: nn.Module, path: str | Path) -> nn.Module:
    """Load weights from `path` into `model` and freeze it: for a model that only predicts (a teacher).

    Accepts a plain state dict, or a checkpoint of a project like this one with one network (its
    "model" entry): a teacher trained by another run, say.
    """
    try:
        state = load_whole(path)
    except Exception as error:
        raise CheckpointError(f"cannot read frozen weights {path} ({first_line(error)}); check the path") from None
    state = state.get("model", state)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise CheckpointError(f"{path} does not fit the frozen model ({first_line(error)})") from None
    return model.requires_grad_(False).eval()


def load_whole(path: str | Path) -> dict[str, Any]:
    """A checkpoint as one dict of whole tensors on the CPU, read by this process alone: for inference,
    export, or a look at the weights."""
    return files.load(Path(path))


def _per_rank(tensors: dict[str, torch.Tensor], world_size: int) -> list[dict[str, torch.Tensor]]:
    """Every rank's values of these tensors (every rank must call this), as one dict per rank."""
    gathered = {name: distributed.all_gather(value) for name, value in tensors.items()}
    return [{name: values[rank] for name, values in gathered.items()} for rank in range(world_size)]


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
