"""Instructions per update of the generated torch loop against the hand-written one, counted by valgrind.

Wall-clock ratios on a shared 2-core VM vary by 0.1x from round to round, so a change worth 2% hides
in them. Instruction counts do not vary. This runs each loop of bench/torch_loop.py (same project,
data, model and batch) under callgrind twice, for 1 warmup + 1 epoch and for 1 warmup + 1 + --extra
epochs; the difference, divided by the updates in between, is what one update costs with the
rendering, the imports and the set-up left out.

Instructions are not time: the loop's Python runs between the model's kernels with cold caches, so
the time ratio is lower than the instruction ratio (0.857x in time against 0.905x in
instructions with --augment torch, template 653a2cf: bench/results/cpu-augment-653a2cf.txt). Use it
to see what a change removes, and report speed with torch_loop.py.

Run from the repository root (needs valgrind; about 3 minutes a loop, its two counts side by side):
    .venv/bin/python bench/instructions.py                          # plain batches of 64
    .venv/bin/python bench/instructions.py --augment torch          # random augmentation drawn from torch
    .venv/bin/python bench/instructions.py --augment torch --baseline-ref HEAD~1   # and an older template
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from timing import REPO, checkout, template_revision

COLLECTED = re.compile(r"Collected : (\d+)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch size.")
    parser.add_argument("--train-size", type=int, default=6400, help="Samples in the train split (100 updates of 64).")
    parser.add_argument("--extra", type=int, default=2, help="Epochs the second count runs more than the first.")
    parser.add_argument("--augment", choices=["torch", "python"], help="As bench/torch_loop.py --augment.")
    parser.add_argument("--baseline-ref", metavar="REF", help="Also count the generated loop of REF's template.")
    parser.add_argument("--inner", choices=["generated", "hand-written"], help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--template", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None and args.inner is None:
        parser.error("valgrind is not installed: install it (apt-get install valgrind) and run again")
    return args


def run_loop(args: argparse.Namespace) -> None:
    """One loop of bench/torch_loop.py, 1 warmup + `args.epochs` epochs (what valgrind counts)."""
    import torch
    import torch_loop

    flags = ["--skip-lightning", "--warmup-epochs", "1", "--epochs", str(args.epochs), "--threads", "1"]
    flags += ["--train-size", str(args.train_size), "--batch-size", str(args.batch_size), "--progress", "off"]
    loop_args = torch_loop.parse_args(flags + (["--augment", args.augment] if args.augment else []))
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="looptpl-instructions-"))
    try:
        project = torch_loop.render_project(work, template=args.template)
        datasets = torch_loop.build_datasets(project, args.train_size, args.augment)
        run = torch_loop.Run(loop_args, project, datasets, work)
        (torch_loop.run_generated if args.inner == "generated" else torch_loop.run_hand_written)(run, 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def count(args: argparse.Namespace, loop: str, epochs: int, template: Path) -> int:
    """Instructions that `loop` runs, rendering and set-up included, with 1 warmup + `epochs` epochs."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
    command += ["--inner", loop, "--epochs", str(epochs), "--template", str(template)]
    command += ["--batch-size", str(args.batch_size), "--train-size", str(args.train_size)]
    command += ["--augment", args.augment] if args.augment else []
    result = subprocess.run(command, capture_output=True, text=True)
    found = COLLECTED.search(result.stderr)
    if result.returncode != 0 or found is None:
        raise RuntimeError(f"{loop} under valgrind failed:\n{result.stderr[-3000:]}")
    return int(found[1])


def per_update(args: argparse.Namespace, loop: str, template: Path) -> float:
    """Instructions per update of `loop`: the two counts' difference over the updates between them."""
    with ThreadPoolExecutor(2) as pool:
        short, long = pool.map(lambda epochs: count(args, loop, epochs, template), (1, 1 + args.extra))
    updates_per_epoch = -(-args.train_size // args.batch_size)
    return (long - short) / (args.extra * updates_per_epoch)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.inner:
        run_loop(args)
        return 0
    with ExitStack() as stack:
        loops = {"hand-written": ("hand-written", REPO), "generated": ("generated", REPO)}
        if args.baseline_ref:
            loops["base"] = ("generated", stack.enter_context(checkout(args.baseline_ref)))
        counts = {}
        for name, (loop, template) in loops.items():
            counts[name] = per_update(args, loop, template)
            print(f"{name:<13} {counts[name] / 1e6:8.3f} M instructions an update", flush=True)
    print(
        f"\nbatch {args.batch_size}, train {args.train_size} samples, 1 + {args.extra} epochs counted; augmentation "
        f"{args.augment or 'off'}; template {template_revision()}"
    )
    hand = counts["hand-written"]
    print(f"hand-written / generated: {hand / counts['generated']:.3f}x (the instructions of an update)")
    if "base" in counts:
        print(f"base / generated        : {counts['base'] / counts['generated']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
