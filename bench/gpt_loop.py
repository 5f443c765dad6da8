"""The GPT example (examples/torch-gpt-ddp) against a plain nanoGPT-style loop on the same model and data.

Both loops train the example's model (its settings, the same seed, so the same initial weights) for
--updates updates on windows of the standard library's text, then evaluate the same fixed
validation windows (the example's --eval-batches subset), each in a fresh process with one thread:

  generated     the example's own `python -m gpt_ddp.train`, one epoch of --updates updates
  hand-written  nanoGPT's loop: per update, --batch-size random offsets drawn with replacement
                (`torch.randint`), the example's model and optim.py's AdamW, nanoGPT's `get_lr`
                (linear warmup, cosine down to --min-lr), clipping at 1.0, the mean cross-entropy

With --ranks 2 both run as two gloo processes under torchrun (one thread each), the same global
batch: the generated loop splits each global batch over the ranks; the hand-written one is
nanoGPT's DDP recipe (each rank draws its own windows from a seed offset by its rank, DDP averages
the gradients). Each round gives both loops its own seed. The table gives the validation loss (mean and standard
deviation over the rounds) and the time per update each loop measured of its training alone
(validation and start-up left out; the generated loop's from its steps.jsonl), paired by round.

Run from the repository root (about 2 minutes on 2 idle CPU cores):
    .venv/bin/python bench/gpt_loop.py
    .venv/bin/python bench/gpt_loop.py --rounds 5 --updates 300
    .venv/bin/python bench/gpt_loop.py --ranks 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import REPO, template_revision

EXAMPLE = REPO / "examples" / "torch-gpt-ddp"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="Paired rounds, one seed each.")
    parser.add_argument("--updates", type=int, default=300, help="Optimizer updates of each run.")
    parser.add_argument("--batch-size", type=int, default=16, help="Windows per update.")
    parser.add_argument("--max-bytes", type=int, default=64, help="Tokens in a window (the example's --max-bytes).")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=96)
    parser.add_argument("--corpus-bytes", type=int, default=2_000_000, help="The corpus's first N bytes.")
    parser.add_argument("--eval-batches", type=int, default=20, help="Validation batches of 64 windows.")
    parser.add_argument("--ranks", type=int, default=1, help="Processes (gloo, under torchrun) of each loop.")
    parser.add_argument("--hand-written", metavar="JSON", help=argparse.SUPPRESS)  # one run of the baseline
    return parser.parse_args(argv)


def example_flags(args: argparse.Namespace, seed: int, data_dir: Path) -> list[str]:
    """The flags both loops read, as the example's train module takes them."""
    return [
        *("--seed", str(seed), "--global-batch-size", str(args.batch_size), "--max-bytes", str(args.max_bytes)),
        *("--layers", str(args.layers), "--width", str(args.width), "--corpus-bytes", str(args.corpus_bytes)),
        *("--eval-batches", str(args.eval_batches), "--eval-batch-size", "64", "--data-dir", str(data_dir)),
        *("--lr", "2e-3", "--min-lr", "2e-4", "--warmup-steps", str(args.updates // 10), "--weight-decay", "0.1"),
    ]


def environment(project: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}


def launcher(args: argparse.Namespace) -> list[str]:
    """How a loop starts: one Python process, or torchrun's --ranks processes on this machine."""
    if args.ranks == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks)]


def run_generated(args: argparse.Namespace, project: Path, seed: int, data_dir: Path) -> dict[str, float]:
    run_dir = project / "runs" / f"seed-{seed}"
    command = [*launcher(args), "-m", "gpt_ddp.train", "--device", "cpu", "--no-progress", "--run-dir", str(run_dir)]
    command += [*example_flags(args, seed, data_dir), "--epochs", "1", "--steps-per-epoch", str(args.updates)]
    subprocess.run(command, cwd=project, env=environment(project), check=True, capture_output=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    # Each record times the updates since the one before it.
    seconds, done = 0.0, 0
    for record in steps:
        seconds += record["update_time_ms"] / 1000 * (record["step"] - done)
        done = record["step"]
    return {"val_loss": summary["val_loss"], "update_ms": 1000 * seconds / done}


def run_hand_written(args: argparse.Namespace, project: Path, seed: int, data_dir: Path) -> dict[str, float]:
    setup = json.dumps({"seed": seed, "data_dir": str(data_dir), "project": str(project)})
    command = [*launcher(args), __file__, *sys.argv[1:], "--hand-written", setup]
    result = subprocess.run(command, env=environment(project), check=True, capture_output=True, text=True)
    return json.loads(result.stdout.splitlines()[-1])


def hand_written(args: argparse.Namespace, setup: dict[str, object]) -> dict[str, float]:
    """nanoGPT's loop on the example's model and data; returns its validation loss and time per update."""
    import random

    import numpy as np
    import torch
    from gpt_ddp import data
    from gpt_ddp.kit.config import parse_config
    from gpt_ddp.kit.sampling import evaluated_samples
    from gpt_ddp.model import build_model
    from gpt_ddp.optim import build_optimizer
    from torch.nn import functional as F

    seed = int(setup["seed"])  # type: ignore[arg-type]
    config = parse_config(example_flags(args, seed, Path(str(setup["data_dir"]))))
    rank = 0
    if args.ranks > 1:
        torch.distributed.init_process_group("gloo")
        rank = torch.distributed.get_rank()
    if rank == 0:
        data.prepare_data(config)
    if args.ranks > 1:
        torch.distributed.barrier()
    random.seed(seed)
    torch.manual_seed(seed)  # as the generated loop seeds before model.py builds: the same initial weights
    raw_model = model = build_model(config)
    optimizer = build_optimizer(model, config)
    if args.ranks > 1:  # nanoGPT's DDP: the optimizer holds the model's own parameters
        model = torch.nn.parallel.DistributedDataParallel(model)
    train = np.memmap(data.token_file(config, "train"), dtype=np.uint16, mode="r")
    block, batch_size = config.max_bytes, config.global_batch_size // args.ranks
    generator = torch.Generator().manual_seed(seed + 1 + rank)  # nanoGPT's seed_offset

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        offsets = torch.randint(len(train) - block, (batch_size,), generator=generator)
        x = torch.stack([torch.from_numpy(train[i : i + block].astype(np.int64)) for i in offsets.tolist()])
        y = torch.stack([torch.from_numpy(train[i + 1 : i + 1 + block].astype(np.int64)) for i in offsets.tolist()])
        return x, y

    def get_lr(step: int) -> float:  # nanoGPT's, with lr_decay_iters = the run's updates
        if step < config.warmup_steps:
            return config.lr * (step + 1) / (config.warmup_steps + 1)
        ratio = (step - config.warmup_steps) / (args.updates - config.warmup_steps)
        return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (config.lr - config.min_lr)

    model.train()
    started = time.perf_counter()
    for step in range(args.updates):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(step)
        x, y = get_batch()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    update_ms = 1000 * (time.perf_counter() - started) / args.updates
    if args.ranks > 1:
        torch.distributed.barrier()  # both ranks have trained: leaving without it was seen to hang rank 0
        torch.distributed.destroy_process_group()
    if rank > 0:
        return {}  # rank 0 evaluates and reports
    model = raw_model
    val = data.Windows(data.token_file(config, "val"), block)
    chosen = list(evaluated_samples(len(val), config.eval_batches * config.eval_batch_size))
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(chosen), config.eval_batch_size):
            items = [val[index] for index in chosen[start : start + config.eval_batch_size]]
            x = torch.stack([item["input_ids"] for item in items])
            y = torch.stack([item["labels"] for item in items])
            total += F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").item()
            tokens += y.numel()
    return {"val_loss": total / tokens, "update_ms": update_ms}


def main() -> None:
    args = parse_args()
    if args.hand_written:
        figures = hand_written(args, json.loads(args.hand_written))
        if figures:  # rank 0's
            print(json.dumps(figures), flush=True)
        return
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="looptpl-gpt-bench-") as folder:
        project = Path(folder) / "gpt"
        shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("runs", "data", "__pycache__"))
        data_dir = Path(folder) / "data"
        results: dict[str, list[dict[str, float]]] = {"generated": [], "hand-written": []}
        for seed in range(args.rounds):
            order = ["generated", "hand-written"] if seed % 2 == 0 else ["hand-written", "generated"]
            for loop in order:
                run = run_generated if loop == "generated" else run_hand_written
                results[loop].append(run(args, project, seed, data_dir))
                figures = results[loop][-1]
                print(
                    f"[round {seed + 1}/{args.rounds}] {loop:<13} val_loss {figures['val_loss']:.4f}  "
                    f"{figures['update_ms']:.2f} ms/update",
                    flush=True,
                )
    print()
    import torch

    shape = f"{args.layers} layers of width {args.width}, {args.batch_size} windows of {args.max_bytes} tokens"
    print(
        f"torch {torch.__version__}, {args.ranks} process(es) of 1 thread on {os.cpu_count()} CPUs; {shape}; "
        f"{args.updates} updates x "
        f"{args.rounds} rounds (one seed each); validation on {args.eval_batches} x 64 fixed windows; "
        f"template {template_revision()}; {time.monotonic() - started:.0f}s"
    )
    print(f"{'loop':<14}{'val_loss mean':>14}{'std':>8}{'ms/update median':>18}")
    for loop, runs in results.items():
        losses = [run["val_loss"] for run in runs]
        deviation = statistics.stdev(losses) if len(losses) > 1 else 0.0
        median = statistics.median(run["update_ms"] for run in runs)
        print(f"{loop:<14}{statistics.mean(losses):>14.4f}{deviation:>8.4f}{median:>18.2f}")
    ratios = [hand["update_ms"] / mine["update_ms"] for mine, hand in zip(*results.values(), strict=True)]
    print(
        f"generated / hand-written: {statistics.median(ratios):.3f}x update rate, median of paired rounds "
        f"(range {min(ratios):.3f} .. {max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
