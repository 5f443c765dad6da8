"""Where a generated torch/single loop spends more than a hand-written one: the update and the data path apart.

End-to-end rounds (torch_loop.py) swing with the machine; these time each part against its hand-written
counterpart in interleaved repeats and keep the minimum, which a busy or throttled machine does not
lower. Two parts, on the project's placeholder MLP, its synthetic task and --global-batch-size:

  update     the project's Trainer.update on one fixed batch, against forward, backward, clip_grad_norm_,
             AdamW's step and a loss sum written by hand (no schedule: the generated one steps its own)
  data path  one epoch of the project's train loader (the global-batch sampler, the TensorDataset's
             batches fetched whole, the move to the device), against DataLoader(shuffle=True) on the
             same set, which fetches and stacks it row by row

Run from the repository root, in the development environment (about a minute on 2 idle cores):
    .venv/bin/python bench/torch_parts.py --batch-size 64
"""

import argparse
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch_loop import build_datasets, fresh_model, render_project


def minimum_us(function: Callable[[], object], number: int, per: int = 1) -> float:
    """The fastest of three repeats of `number` calls, in microseconds per call (divided by `per`)."""
    return min(timeit.repeat(function, number=number, repeat=3)) / number / per * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch size.")
    parser.add_argument("--train-size", type=int, default=16_000, help="Samples of the data path's epoch.")
    parser.add_argument("--rounds", type=int, default=12, help="Interleaved rounds; the minimum of each side is kept.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="looptpl-parts-"))
    project = render_project(work)
    train, val, test = build_datasets(project, args.train_size)
    flags = ["--device", "cpu", "--run-dir", str(work / "run"), "--no-progress"]
    config = project.config.parse_config([*flags, "--global-batch-size", str(args.batch_size)])
    (work / "run").mkdir()
    runtime = project.train.distributed.setup(config)
    torch.manual_seed(0)
    trainer = project.train.Trainer(config, runtime, project.model.build_model(config), (train, val, test))
    trainer.set_training(True)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
