"""Where a generated torch/single loop spends more than a hand-written one: the update and the data path apart.

End-to-end rounds (torch_loop.py) swing with the machine; these time each part against its hand-written
counterpart in interleaved repeats and keep the minimum, which a busy or throttled machine does not
lower. Two parts, on the project's placeholder MLP, its synthetic task and --global-batch-size:

  update     the project's Trainer.update on one fixed batch, against forward, backward, clip_grad_norm_,
             AdamW's step and a loss sum written by hand (no schedule: the generated one steps its own)
  data path  one epoch of the project's train loader (the global-batch sampler, the TensorDataset's
             batches fetched whole, the move to the device), against DataLoader(shuffle=True) on the
             same set, which fetches and stacks it row by row

With --augment, a third: the train set augmented as in torch_loop.py --augment, each batch loaded by
the project's loader (every sample seeded, the generators watched) and by DataLoader(shuffle=True), in a
new random order every batch and each followed by an update of the model, so that the loading runs with
the caches as cold as in a training loop; medians a batch (a minimum would pick the batches that found
the caches warm). With --baseline-ref, the loader of the template at that commit takes turns as well.

Run from the repository root, in the development environment (about a minute on 2 idle cores):
    .venv/bin/python bench/torch_parts.py --batch-size 64
    .venv/bin/python bench/torch_parts.py --augment torch --baseline-ref HEAD   # about 2 minutes more
"""

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
import timeit
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch_loop import build_datasets, fresh_model, render_baseline, render_project


def minimum_us(function: Callable[[], object], number: int, per: int = 1) -> float:
    """The fastest of three repeats of `number` calls, in microseconds per call (divided by `per`)."""
    return min(timeit.repeat(function, number=number, repeat=3)) / number / per * 1e6


def project_trainer(project: types.ModuleType, datasets: tuple[Dataset, ...], run_dir: Path, batch_size: int) -> Any:
    """The project's Trainer on `datasets`, training on the CPU."""
    flags = ["--device", "cpu", "--run-dir", str(run_dir), "--no-progress", "--global-batch-size", str(batch_size)]
    config = project.config.parse_config(flags)
    run_dir.mkdir()
    runtime = project.train.distributed.setup(config)
    torch.manual_seed(0)
    trainer = project.train.Trainer(config, runtime, project.model.build_model(config), datasets)
    trainer.set_training(True)
    return trainer


def generated_batches(trainer: Any) -> Iterator[Any]:
    """The project's train batches, epoch after epoch, as its loop gets them."""
    loaders = trainer.loaders
    for epoch in itertools.count():
        batches = loaders.start_epoch(epoch, 0)
        for update in range(loaders.updates_per_epoch):
            yield loaders.next_update(batches, update)[0][0]


def hand_batches(train: Dataset, batch_size: int) -> Iterator[Any]:
    """DataLoader(shuffle=True)'s batches, epoch after epoch."""
    while True:
        yield from DataLoader(train, batch_size=batch_size, shuffle=True)


def in_the_loop(loaders: dict[str, Iterator[Any]], update: Callable[[Any], None], batches: int) -> dict[str, float]:
    """Each loader's median microseconds a batch: in each of `batches` turns every loader loads one, in a new
    random order, and an update of the model follows each (it leaves the caches as a training step does)."""
    times: dict[str, list[int]] = {name: [] for name in loaders}
    order = list(loaders)
    shuffler = random.Random(0)  # not Python's global generator: the loop would see it move and take its state
    for _ in range(batches):
        shuffler.shuffle(order)
        for name in order:
            started = time.perf_counter_ns()
            batch = next(loaders[name])
            times[name].append(time.perf_counter_ns() - started)
            update(batch)
    return {name: statistics.median(values) / 1000 for name, values in times.items()}


def augmented_data_path(args: argparse.Namespace, work: Path, project: types.ModuleType) -> None:
    """The augmented train set's batches, loaded in the loop by `project`, DataLoader and (--baseline-ref) the
    template at that commit; prints the medians."""
    projects = {"generated": project}
    if args.baseline_ref:
        projects["base"] = render_baseline(work, args.baseline_ref)
    datasets = build_datasets(projects["generated"], args.train_size, args.augment)
    loaders = {"hand-written": hand_batches(datasets[0], args.batch_size)}
    for name, project in projects.items():
        loaders[name] = generated_batches(project_trainer(project, datasets, work / f"run-{name}", args.batch_size))
    model = fresh_model(projects["generated"])
    optimizer = torch.optim.AdamW(model.parameters())

    def update(batch: Any) -> None:
        inputs, targets = batch
        F.cross_entropy(model(inputs), targets).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    for loader in loaders.values():
        next(loader)  # the first batch of each: the seeded generators found, the first epoch's order made
    medians = in_the_loop(loaders, update, args.augmented_batches)
    hand = medians.pop("hand-written")
    print(
        f"augmented data path, drawn from {args.augment}, in the loop (median of {args.augmented_batches} batches, "
        f"{time.perf_counter() - started:.0f}s): hand-written {hand:.0f} us a batch",
        flush=True,
    )
    for name, median in medians.items():
        ref = f" (template {args.baseline_ref})" if name == "base" else ""
        print(f"  {name:<10}{ref} {median:6.0f} us: {median - hand:+.0f} us, ratio {hand / median:.3f}x", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch size.")
    parser.add_argument("--train-size", type=int, default=16_000, help="Samples of the data path's epoch.")
    parser.add_argument("--rounds", type=int, default=12, help="Interleaved rounds; the minimum of each side is kept.")
    parser.add_argument(
        "--augment", choices=["torch", "python"], help="Also time the augmented data path in the loop (torch_loop.py)."
    )
    parser.add_argument("--augmented-batches", type=int, default=1500, help="Batches each loader loads with --augment.")
    parser.add_argument("--baseline-ref", default="", help="With --augment: the loader of this commit's template too.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="looptpl-parts-"))
    project = render_project(work)
    train, val, test = build_datasets(project, args.train_size)
    trainer = project_trainer(project, (train, val, test), work / "run", args.batch_size)
    config = trainer.config
    assert isinstance(train, TensorDataset)
    inputs, targets = train.tensors[0][: args.batch_size], train.tensors[1][: args.batch_size]

    model = fresh_model(project)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    loss_sum = torch.zeros(())

    def hand_update() -> None:
        loss = F.cross_entropy(model(inputs), targets, reduction="none")
        loss.mean().backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_sum.add_(loss.detach().sum())

    def generated_epoch() -> None:
        loaders = trainer.loaders
        batches = loaders.start_epoch(0, 0)
        for update in range(loaders.updates_per_epoch):
            loaders.next_update(batches, update)

    def hand_epoch() -> None:
        for _ in DataLoader(train, batch_size=args.batch_size, shuffle=True):
            pass

    batches = -(-args.train_size // args.batch_size)
    parts = {
        "update": (lambda: trainer.update([(inputs, targets)], args.batch_size, "bench"), hand_update, 100, 1),
        "data path": (generated_epoch, hand_epoch, 1, batches),
    }
    print(f"torch {torch.__version__}, 1 thread; batch {args.batch_size}; minimum of {args.rounds} interleaved rounds")
    for name, (generated, hand, number, per) in parts.items():
        best_generated = best_hand = float("inf")
        started = time.perf_counter()
        for _ in range(args.rounds):
            best_generated = min(best_generated, minimum_us(generated, number, per))
            best_hand = min(best_hand, minimum_us(hand, number, per))
        print(
            f"{name:<10} generated {best_generated:8.1f} us, hand-written {best_hand:8.1f} us a batch: "
            f"{best_generated - best_hand:+.1f} us, ratio {best_hand / best_generated:.3f}x "
            f"({time.perf_counter() - started:.0f}s)",
            flush=True,
        )
    if args.augment:
        augmented_data_path(args, work, project)
    return 0


if __name__ == "__main__":
    sys.exit(main())
