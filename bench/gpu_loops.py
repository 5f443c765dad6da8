"""The loops bench/gpu_loop.py compares, each run in a worker process of its own.

A worker builds its loop, trains --warmup-epochs untimed epochs (compilation, allocator warm-up),
prints READY, then trains one timed epoch for each `epoch` line on its stdin and answers with a
RESULT line (JSON: seconds, samples, peak memory). Each loop is timed from a device
synchronization before its epoch to one after it, so queued GPU work is inside the time.

  ceiling       the fastest loop we know how to write by hand: the whole data set on the GPU,
                batches drawn by a GPU permutation, fused AdamW, no host synchronization at all
  hand          what a competent user writes: DataLoader(shuffle, pin_memory), non-blocking
                copies, AdamW's default, clip_grad_norm_, loss.item() every 10 updates
  lightning     lightning.Trainer(precision="bf16-mixed"), no logger, bar, checkpoints or validation
  accelerate    accelerate.Accelerator(mixed_precision="bf16") around the hand-written loop
  generated     a rendered looptpl project's own Trainer.train_epoch, with its default flags

Every loop has the same model, initial weights, data, batch, AdamW settings, clipping (1.0) and
warmup + cosine schedule; `-compiled` variants wrap the model in torch.compile.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from gpu_workloads import PRESETS, Shape, build_dataset, build_model, losses, shard_units, warmup_cosine
from torch.utils.data import DataLoader

LOG_EVERY = 10  # updates between loss reads in the hand-written loops, as the template's --log-every


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, dict):
        return {key: value.to(device, non_blocking=True) for key, value in batch.items()}
    return [value.to(device, non_blocking=True) for value in batch]


class Worker:
    """What every loop shares: the workload, the device, the epochs and the timing protocol."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.shape: Shape = PRESETS[args.model]
        # Under torchrun (ddp-xN, fsdp-xN) every rank trains on its own GPU, and rank 0 alone talks
        # to the driver: it reads the commands, hands each to the other ranks, and reports.
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device(args.device)
        self.dataset = build_dataset(self.shape, args.steps * self.shape.batch)
        self.total_epochs = args.warmup_epochs + args.rounds + 1  # one more for --profile
        self.total_steps = self.total_epochs * args.steps

    def optimizer(self, model: torch.nn.Module, fused: bool | None = None) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=self.args.lr, weight_decay=self.args.weight_decay, fused=fused)

    def loader(self) -> DataLoader:
        pin = self.device.type == "cuda"
        return DataLoader(self.dataset, batch_size=self.shape.batch, shuffle=True, drop_last=True, pin_memory=pin)

    def serve(self, run_epoch: Callable[[], None]) -> None:
        """Warm up, then time one epoch per `epoch` command; `profile` profiles one."""
        for _ in range(self.args.warmup_epochs):
            run_epoch()
        self.ready()
        while self.wait_for_command(run_epoch):
            with self.timed():
                run_epoch()

    def ready(self) -> None:
        self.report("READY")

    def report(self, line: str) -> None:
        if self.rank == 0:
            print(line, flush=True)

    def wait_for_command(self, run_epoch: Callable[[], None]) -> bool:
        """Whether the driver asks for a timed epoch; `profile` requests are answered on the way."""
        command = self.next_command()
        while command == "profile":
            self.profile(run_epoch)
            command = self.next_command()
        return command == "epoch"

    def next_command(self) -> str:
        """The driver's next command, read by rank 0 and handed to every other rank."""
        command = [sys.stdin.readline().strip() if self.rank == 0 else ""]
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.broadcast_object_list(command, src=0)
        return command[0]

    def profile(self, run_epoch: Callable[[], None]) -> None:
        """One epoch under cProfile: the functions with the most time of their own, then the most in all."""
        import cProfile
        import io
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        run_epoch()
        synchronize(self.device)
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(35)
        self.report("PROFILE " + json.dumps(text.getvalue()))

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        synchronize(self.device)
        started = time.perf_counter()
        yield
        synchronize(self.device)
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else 0
        result = {"seconds": seconds, "samples": self.args.steps * self.shape.batch, "peak_bytes": peak}
        self.report("RESULT " + json.dumps(result))
        if self.args.release_memory and self.device.type == "cuda":
            torch.cuda.empty_cache()  # outside the timed region: let the other workers' epochs have the memory


def run_ceiling(worker: Worker, compiled: bool) -> None:
    """Data on the GPU, fused AdamW, the loss summed on the device and read once per epoch."""
    model = build_model(worker.shape).to(worker.device)
    step_model = torch.compile(model) if compiled else model
    optimizer = worker.optimizer(model, fused=True)
    schedule = warmup_cosine(optimizer, worker.total_steps)
    dataset = worker.dataset
    rows = getattr(dataset, "rows", None)
    data = [rows] if rows is not None else [dataset.images, dataset.labels]  # type: ignore[attr-defined]
    data = [tensor.to(worker.device) for tensor in data]
    size, batch = len(data[0]), worker.shape.batch

    def run_epoch() -> None:
        order = torch.randperm(size, device=worker.device)[: worker.args.steps * batch].view(-1, batch)
        total = torch.zeros((), device=worker.device)
        for indices in order:
            picked = [tensor[indices] for tensor in data]
            batch_data: Any = {"tokens": picked[0]} if rows is not None else picked
            with autocast(worker.device, worker.args.precision):
                loss = losses(step_model, batch_data).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            total += loss.detach()
        total.item()

    worker.serve(run_epoch)


def run_hand(worker: Worker, compiled: bool) -> None:
    """A plain, competent loop: DataLoader, non-blocking copies, AdamW's default implementation."""
    model = build_model(worker.shape).to(worker.device)
    step_model = torch.compile(model) if compiled else model
    optimizer = worker.optimizer(model)
    schedule = warmup_cosine(optimizer, worker.total_steps)
    loader = worker.loader()
    logged: list[float] = []

    def run_epoch() -> None:
        for step, batch in enumerate(loader, 1):
            batch = to_device(batch, worker.device)
            with autocast(worker.device, worker.args.precision):
                loss = losses(step_model, batch).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if step % LOG_EVERY == 0:
                logged.append(loss.item())

    worker.serve(run_epoch)


def run_accelerate(worker: Worker, compiled: bool) -> None:
    """The hand-written loop under accelerate.Accelerator (bf16 autocast, its DataLoader and clipping)."""
    from accelerate import Accelerator

    precision = {"bf16": "bf16", "fp16": "fp16"}.get(worker.args.precision, "no")
    accelerator = Accelerator(mixed_precision=precision, cpu=worker.device.type == "cpu")
    model = build_model(worker.shape)
    optimizer = worker.optimizer(model)
    schedule = warmup_cosine(optimizer, worker.total_steps)
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, worker.loader(), schedule)
    step_model = torch.compile(model) if compiled else model
    logged: list[float] = []

    def run_epoch() -> None:
        for step, batch in enumerate(loader, 1):
            loss = losses(step_model, batch).mean()
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if step % LOG_EVERY == 0:
                logged.append(loss.item())

    worker.serve(run_epoch)


def run_lightning(worker: Worker, compiled: bool) -> None:
    """lightning.Trainer; a callback holds each epoch's start until the driver asks for it, and times it."""
    import lightning as L

    shape, args = worker.shape, worker.args

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = build_model(shape)

        def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
            return losses(self.net, batch).mean()

        def configure_optimizers(self) -> Any:
            optimizer = worker.optimizer(self.net)
            schedule = {"scheduler": warmup_cosine(optimizer, worker.total_steps), "interval": "step"}
            return {"optimizer": optimizer, "lr_scheduler": schedule}

    class Paced(L.Callback):
        timer: contextlib.AbstractContextManager[None] | None = None

        def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
            if trainer.current_epoch < args.warmup_epochs:
                return
            if trainer.current_epoch == args.warmup_epochs:
                worker.ready()
            if not worker.wait_for_command(lambda: None):
                sys.exit(0)
            self.timer = worker.timed()
            self.timer.__enter__()

        def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
            if self.timer is not None:
                self.timer.__exit__(None, None, None)
                self.timer = None

    module = Module()
    if compiled:
        module.net = torch.compile(module.net)  # type: ignore[assignment]
    precision = {"bf16": "bf16-mixed", "fp16": "16-mixed"}.get(args.precision, "32-true")
    trainer = L.Trainer(
        accelerator="gpu" if worker.device.type == "cuda" else "cpu",
        devices=1,
        precision=precision,
        max_epochs=worker.total_epochs,
        gradient_clip_val=1.0,
        gradient_clip_algorithm="norm",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[Paced()],
        default_root_dir=tempfile.mkdtemp(prefix="bench-lightning-"),
    )
    trainer.fit(module, train_dataloaders=worker.loader())


def run_generated(worker: Worker, project: Path, flags: list[str]) -> None:
    """A rendered project's Trainer, built as its train.py builds it, on the benchmark's model and data."""
    source = project / "src"
    (package,) = [path.name for path in source.iterdir() if (path / "train.py").exists()]
    sys.path.insert(0, str(source))
    names = {"config": "kit.config", "distributed": "distributed", "train": "train"}
    modules = {name: importlib.import_module(f"{package}.{module}") for name, module in names.items()}
    if hasattr(modules["distributed"], "shard_units"):
        modules["distributed"].shard_units = shard_units  # FSDP's units: the blocks (model.py's job in a project)
    # --activation-checkpointing recomputes the same blocks (model.py's checkpoint_units in a project).
    importlib.import_module(f"{package}.model").checkpoint_units = shard_units
    args, shape = worker.args, worker.shape
    run_dir = tempfile.mkdtemp(prefix=f"bench-{project.name}-")
    argv = [
        "--device", args.device,
        "--precision", args.precision,
        "--global-batch-size", str(shape.batch),
        "--epochs", str(worker.total_epochs),
        "--lr", str(args.lr),
        "--weight-decay", str(args.weight_decay),
        "--run-dir", run_dir,
        "--no-progress",
        *flags,
    ]  # fmt: skip
    config = modules["config"].parse_config(argv)
    runtime = modules["distributed"].setup(config)
    modules["train"].seed_everything(config.seed)
    evaluation = build_dataset(shape, shape.batch, seed=2)
    trainer = modules["train"].Trainer(config, runtime, build_model(shape), (worker.dataset, evaluation, evaluation))
    modules["train"].seed_everything(config.seed + runtime.rank)
    if trainer.updates_per_epoch != args.steps:
        raise RuntimeError(f"{project.name} trains {trainer.updates_per_epoch} updates an epoch, not {args.steps}")
    epochs = iter(range(worker.total_epochs))

    def run_epoch() -> None:
        trainer.train_epoch(next(epochs))

    worker.serve(run_epoch)


LOOPS: dict[str, Callable[[Worker, bool], None]] = {
    "ceiling": run_ceiling,
    "hand": run_hand,
    "lightning": run_lightning,
    "accelerate": run_accelerate,
}


def main_worker(args: argparse.Namespace) -> None:
    """Entry point of a worker process: `--worker KIND[-compiled]` or `--worker generated --project DIR`."""
    worker = Worker(args)
    if args.worker == "generated":
        run_generated(worker, Path(args.project), args.flags)
        return
    kind, compiled = args.worker.removesuffix("-compiled"), args.worker.endswith("-compiled")
    LOOPS[kind](worker, compiled)
