"""Training throughput of a freshly rendered torch/single project against two baselines.

Renders a project with `looptpl new` into a temporary folder, imports its package, and times
three loops on the same model (the project's placeholder MLP), the same synthetic data (the
project's task, with a larger train split) and the same global batch:

  generated     the project's own `train.main()`, i.e. `Trainer.fit()` with the progress bar,
                the metric logger, validation and checkpoints on; only `train_epoch` is timed
  hand-written  DataLoader(TensorDataset, shuffle=True), AdamW, clip_grad_norm_, loss.mean(); with
                --hand-batched, each batch one index of each tensor, as the generated loop fetches it
  lightning     lightning.Trainer on CPU, 1 device, no logger, bar, checkpoints or validation
  no-hook       with --hook-cost: the generated loop from a second render whose train.py has the
                after_update hook call deleted; generated / no-hook is what the default (no-op)
                hooks.py costs on the hot path
  base          with --baseline-ref REF: the generated loop of the template at commit REF, so
                base / generated is what a template change bought, paired by round

Every loop runs one untimed warmup epoch and then --epochs timed ones; the loops take turns
within each of --rounds rounds (in a rotating order). The table gives, per loop, the median and
the spread of samples/s over rounds, the best single epoch, and samples per CPU-second; the
ratios are paired by round. The project's targets: generated >= 0.95x hand-written (0.85x at a global
batch of 16 or less; 0.9x with --augment).

Run from the repository root (about 1 minute on 2 idle CPU cores, up to 3 when they are shared):
    .venv/bin/pip install lightning "torch==2.13.0"        # once; keeps torch where it is
    .venv/bin/python bench/torch_loop.py
    .venv/bin/python bench/torch_loop.py --rounds 5 --epochs 2 --train-size 50000 --batch-size 64 --threads 1
    .venv/bin/python bench/torch_loop.py --hook-cost --skip-lightning --batch-size 16 --rounds 7
    .venv/bin/python bench/torch_loop.py --augment --skip-lightning   # random augmentation in every loop
    .venv/bin/python bench/torch_loop.py --augment python --skip-lightning   # ... drawn from Python's random
    .venv/bin/python bench/torch_loop.py --skip-lightning --baseline-ref HEAD~1   # against an older template
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from timing import REPO, EpochClock, checkout, patched, pretend_tty, print_comparison, rate, template_revision
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

TARGET_RATIO = 0.95  # generated / hand-written, as the project states it
SMALL_BATCH_TARGET_RATIO = 0.85  # the same at a global batch of 16 or less, where the loop's own work weighs most
AUGMENTED_TARGET_RATIO = 0.9  # the same with random augmentation (#36)
HOOK_CALL = '            self.hook("after_update", self.run)'  # train.py's call of the per-update hook
VAL_SIZE, TEST_SIZE = 251, 257  # the template's own evaluation split sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2, help="Timed epochs per run, after the warmup epoch.")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="Untimed epochs at the start of every run.")
    parser.add_argument("--train-size", type=int, default=50_000, help="Samples in the synthetic train split.")
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch size (the template's default).")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds; each runs every loop once.")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every loop.")
    parser.add_argument(
        "--progress",
        choices=["tty", "real", "off"],
        default="tty",
        help="Generated loop's progress bar: tty makes sys.stderr.isatty() return True so the bar draws "
        "even when stderr is a file or pipe (default); real leaves stderr alone (the bar draws only on a "
        "terminal); off passes --no-progress.",
    )
    parser.add_argument(
        "--hand-schedule",
        action="store_true",
        help="Give the hand-written loop the project's warmup+cosine LambdaLR too (the generated loop always has it).",
    )
    parser.add_argument(
        "--hand-batched",
        action="store_true",
        help="Give the hand-written loop the generated loop's data path for a TensorDataset: each batch one index "
        "of each tensor (by a shuffled permutation), in place of DataLoader's row-by-row fetch and collate. "
        "generated / hand-written is then what the rest of the generated loop costs.",
    )
    parser.add_argument("--skip-lightning", action="store_true", help="Time only generated and hand-written.")
    parser.add_argument(
        "--hook-cost",
        action="store_true",
        help="Also time the generated loop without its after_update hook call (deleted from a second render).",
    )
    parser.add_argument(
        "--augment",
        nargs="?",
        const="torch",
        choices=["torch", "python"],
        help="Give every train sample random augmentation in every loop: noise and a scale drawn from torch's "
        "generator, as torchvision's transforms draw (torch, the default), or the scale from Python's `random`, as "
        "albumentations draws (python). The generated loop seeds each generator data.py draws from per sample, "
        "for exact resume; the others draw freely. Target: 0.9x.",
    )
    parser.add_argument(
        "--baseline-ref",
        metavar="REF",
        help="Also time the generated loop of the template at this commit (loop `base`), paired by round.",
    )
    parser.add_argument("--keep", action="store_true", help="Keep the temporary project folder and print it.")
    args = parser.parse_args(argv)
    for name in ("epochs", "train_size", "batch_size", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


# --- the rendered project -----------------------------------------------------------------------


def render_project(root: Path, name: str = "benchproj", drop_line: str = "", template: Path = REPO) -> types.ModuleType:
    """`looptpl new` a torch/single project `name` under `root` with the looptpl of `template` (a
    checkout) and import its package; `drop_line` (if given) is deleted from its train.py first, and
    must be there."""
    destination = root / name
    command = [sys.executable, "-m", "looptpl", "new", str(destination), "--backend", "torch", "--strategy", "single"]
    command += ["--defaults", "--no-git"]
    environment = {**os.environ, "PYTHONPATH": str(template / "generator")}  # the checkout renders its own template
    subprocess.run(command, check=True, cwd=template, env=environment, stdout=subprocess.DEVNULL)
    (package_dir,) = [path for path in (destination / "src").iterdir() if (path / "train.py").exists()]
    if drop_line:
        engine = package_dir / "train.py"
        source = engine.read_text()
        if source.count(drop_line + "\n") != 1:
            raise RuntimeError(f"train.py does not hold the line {drop_line.strip()!r} once")
        engine.write_text(source.replace(drop_line + "\n", ""))
    sys.path.insert(0, str(destination / "src"))
    package = importlib.import_module(package_dir.name)
    for module in ("train", "data", "model", "optim"):
        setattr(package, module, importlib.import_module(f"{package_dir.name}.{module}"))
    package.config = importlib.import_module(f"{package_dir.name}.kit.config")
    return package


def render_baseline(root: Path, ref: str) -> types.ModuleType:
    """The project `benchbase`, rendered by the looptpl of commit `ref` (a temporary git worktree)."""
    with checkout(ref) as template:
        return render_project(root, "benchbase", template=template)


class Augmented(Dataset):
    """A train split whose samples get fresh random augmentation on every load: Gaussian noise, and a
    scale drawn from torch's generator (`draws="torch"`, as torchvision's transforms draw) or from
    Python's (`draws="python"`, as albumentations draws)."""

    def __init__(self, base: TensorDataset, draws: str) -> None:
        self.base, self.draws = base, draws

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, target = self.base[index]
        # torchvision draws a parameter as torch.empty(1).uniform_(...); albumentations with random.uniform.
        scale = float(torch.empty(1).uniform_(0.9, 1.1)) if self.draws == "torch" else random.uniform(0.9, 1.1)
        return (inputs + 0.1 * torch.randn(inputs.shape)) * scale, target


def build_datasets(
    project: types.ModuleType, train_size: int, augment: str | None = None
) -> tuple[Dataset, TensorDataset, TensorDataset]:
    """The project's synthetic task (data.py), with `train_size` training samples (augmented, drawing from
    torch's generator or Python's, if asked)."""
    data = project.data
    generator = torch.Generator().manual_seed(1234)
    hidden = torch.randn(data.NUM_FEATURES, 32, generator=generator)
    readout = torch.randn(32, data.NUM_CLASSES, generator=generator)

    def make_split(size: int) -> TensorDataset:
        inputs = torch.randn(size, data.NUM_FEATURES, generator=generator)
        targets = (torch.tanh(inputs @ hidden) @ readout).argmax(dim=1)
        return TensorDataset(inputs, targets)

    train = make_split(train_size)
    return Augmented(train, augment) if augment else train, make_split(VAL_SIZE), make_split(TEST_SIZE)


def fresh_model(project: types.ModuleType, seed: int = 0) -> torch.nn.Module:
    """The project's model, built with the seed the project's own run uses."""
    torch.manual_seed(seed)
    model: torch.nn.Module = project.model.build_model(project.config.TrainConfig())
    return model


# --- the three loops; each returns (wall, cpu) seconds of its timed epochs -----------------------


class Run:
    """What one loop needs: the data, the batch, the epochs, and where to write."""

    def __init__(
        self, args: argparse.Namespace, project: types.ModuleType, datasets: tuple[TensorDataset, ...], work: Path
    ) -> None:
        self.args, self.project, self.datasets, self.work = args, project, datasets, work
        self.total_epochs = args.warmup_epochs + args.epochs
        self.defaults = project.config.TrainConfig()  # lr, weight decay, clipping: the template's defaults

    def timed(self, clock: EpochClock) -> list[tuple[float, float]]:
        """The epochs after the warmup."""
        if len(clock.epochs) != self.total_epochs:
            raise RuntimeError(f"expected {self.total_epochs} timed epochs, got {len(clock.epochs)}")
        return clock.epochs[self.args.warmup_epochs :]


def run_generated(run: Run, round_index: int, project: types.ModuleType | None = None) -> list[tuple[float, float]]:
    """The project's `train.main()` with the bigger train split; times `Trainer.train_epoch`."""
    project, args = project or run.project, run.args
    train_module = project.train
    clock = EpochClock()

    class TimedTrainer(train_module.Trainer):  # type: ignore[name-defined,misc]
        def train_epoch(self, epoch: int) -> dict[str, float]:
            # A single process keeps every sample, the short last batch included; check it anyway.
            sampler = self.loaders.sampler
            if sampler.samples_per_epoch != args.train_size:
                raise RuntimeError(
                    f"generated loop trains {sampler.samples_per_epoch} samples an epoch, not {args.train_size}"
                )
            clock.start()
            result: dict[str, float] = super().train_epoch(epoch)
            clock.stop()
            return result

    run_dir = run.work / f"runs/{project.__name__}-{round_index}"
    argv = [
        "--device", "cpu",
        "--run-dir", str(run_dir),
        "--epochs", str(run.total_epochs),
        "--global-batch-size", str(args.batch_size),
    ]  # fmt: skip
    if args.progress == "off":
        argv.append("--no-progress")
    with (
        patched(train_module, Trainer=TimedTrainer, build_datasets=lambda config: run.datasets),
        pretend_tty(sys.stderr, args.progress == "tty"),
    ):
        code = train_module.main(argv)
    if code != 0:
        raise RuntimeError(f"generated train.main exited with {code}")
    return run.timed(clock)


def run_hand_written(run: Run, round_index: int) -> list[tuple[float, float]]:
    """What a competent user writes by hand: same model, data, batch, AdamW and clipping."""
    config = run.defaults
    model = fresh_model(run.project)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    loader = DataLoader(run.datasets[0], batch_size=run.args.batch_size, shuffle=True)
    scheduler = None
    if run.args.hand_schedule:  # the project's own warmup + cosine schedule, stepped every update
        scheduler = run.project.optim.build_scheduler(optimizer, config, len(loader) * run.total_epochs)
    clock = EpochClock()
    for epoch in range(run.total_epochs):
        clock.start()
        model.train()
        loss_sum = torch.zeros(())
        for inputs, targets in batches_of(loader, run.args.hand_batched):
            loss = F.cross_entropy(model(inputs), targets, reduction="none")
            loss.mean().backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach().sum()
        print(f"hand-written epoch {epoch + 1}: train_loss {loss_sum.item() / len(run.datasets[0]):.4f}", flush=True)
        clock.stop()
    return run.timed(clock)


def batches_of(loader: DataLoader, whole: bool) -> Iterable[list[torch.Tensor]]:
    """The loader's batches, or (`whole`) the same shuffle's batches each fetched at once from its TensorDataset."""
    if not whole:
        return loader
    tensors = loader.dataset.tensors  # type: ignore[attr-defined]
    order = torch.randperm(len(tensors[0]))
    return ([tensor[indices] for tensor in tensors] for indices in order.split(loader.batch_size))  # type: ignore[arg-type]


def run_lightning(run: Run, round_index: int) -> list[tuple[float, float]]:
    """lightning.Trainer with everything optional off; a callback times each training epoch."""
    import lightning as L  # imported here: a few seconds, and only when asked for

    config = run.defaults

    class Module(L.LightningModule):
        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_index: int) -> torch.Tensor:
            inputs, targets = batch
            return F.cross_entropy(self.net(inputs), targets, reduction="none").mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=config.lr, weight_decay=config.weight_decay)

    clock = EpochClock()

    class EpochTimer(L.Callback):
        def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
            clock.start()

        def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
            clock.stop()

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=run.total_epochs,
        gradient_clip_val=config.max_grad_norm,
        gradient_clip_algorithm="norm",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[EpochTimer()],
        default_root_dir=str(run.work / f"runs/lightning-{round_index}"),
    )
    loader = DataLoader(run.datasets[0], batch_size=run.args.batch_size, shuffle=True)
    trainer.fit(Module(fresh_model(run.project)), train_dataloaders=loader)
    return run.timed(clock)


# --- driver ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")  # Lightning's hints about workers and loggers
    loops: dict[str, Callable[[Run, int], list[tuple[float, float]]]] = {
        "generated": run_generated,
        "hand-written": run_hand_written,
    }
    if not args.skip_lightning:
        loops["lightning"] = run_lightning
    work = Path(tempfile.mkdtemp(prefix="looptpl-bench-"))
    try:
        project = render_project(work)
        if args.hook_cost:
            without_hook = render_project(work, "benchnohook", HOOK_CALL)
            loops["no-hook"] = lambda run, round_index: run_generated(run, round_index, without_hook)
        if args.baseline_ref:
            base = render_baseline(work, args.baseline_ref)
            loops["base"] = lambda run, round_index: run_generated(run, round_index, base)
        run = Run(args, project, build_datasets(project, args.train_size, args.augment), work)
        timings: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in loops}  # [round][epoch]
        names = list(loops)
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        for round_index in range(args.rounds):
            # Rotate the order each round, so no loop always runs first (or right after Lightning).
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                torch.set_num_threads(args.threads)
                gc.collect()
                epochs = loops[name](run, round_index)
                if torch.get_num_threads() != args.threads:
                    raise RuntimeError(f"{name} changed torch's thread count to {torch.get_num_threads()}")
                timings[name].append(epochs)
                seconds = " ".join(f"{w:.3f}" for w, _ in epochs)
                print(
                    f"[round {round_index + 1}/{args.rounds}] {name:<12} {rate(args, epochs, 0):>9,.0f} samples/s "
                    f"({rate(args, epochs, 1):,.0f} per CPU-s); epochs {seconds} s",
                    flush=True,
                )
        elapsed = time.perf_counter() - started
        report(args, timings, elapsed, (load_before, os.getloadavg()[0]))
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def report(
    args: argparse.Namespace,
    timings: dict[str, list[list[tuple[float, float]]]],
    elapsed: float,
    load: tuple[float, float],
) -> None:
    cores = os.cpu_count() or 1
    print(
        f"\ntorch {torch.__version__}, {args.threads} thread(s) on {cores} CPUs; train {args.train_size} samples, "
        f"batch {args.batch_size}, {args.warmup_epochs} warmup + {args.epochs} timed epochs x {args.rounds} rounds; "
        f"progress bar {args.progress}; augmentation {f'drawn from {args.augment}' if args.augment else 'off'}; "
        f"hand-written schedule {'warmup+cosine' if args.hand_schedule else 'none'}; "
        f"hand-written batches {'fetched whole' if args.hand_batched else 'from DataLoader'}; "
        f"template {template_revision()}; {elapsed:.0f}s; load average {load[0]:.1f} -> {load[1]:.1f}"
    )
    if max(load) > cores:
        print(f"warning: load average above {cores}: other processes share the CPUs, so expect noise")
    print_comparison(args, timings, {"hand-written": str(target_ratio(args))})


def target_ratio(args: argparse.Namespace) -> float:
    """The project's target for generated / hand-written in this run's setting."""
    if args.augment:
        return AUGMENTED_TARGET_RATIO
    return SMALL_BATCH_TARGET_RATIO if args.batch_size <= 16 else TARGET_RATIO


if __name__ == "__main__":
    sys.exit(main())
