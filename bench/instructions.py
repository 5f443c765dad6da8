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

With --caches, callgrind also runs its model of the caches (first level 32 KiB of instructions and of
data, last level this machine's), as cold after the model's update as in the loop, and prints each
level's misses an update and cachegrind's estimate of cycles, Ir + 10 x first-level misses + 100 x
last-level misses: as deterministic as the instructions, and a change that only moves code about (fewer
instructions, more misses) shows there. It is a model, not the machine: report speed with torch_loop.py.

Run from the repository root (needs valgrind; about 3 minutes a loop, its two counts side by side):
    .venv/bin/python bench/instructions.py                          # plain batches of 64
    .venv/bin/python bench/instructions.py --augment torch          # random augmentation drawn from torch
    .venv/bin/python bench/instructions.py --augment torch --baseline-ref HEAD~1   # and an older template
    .venv/bin/python bench/instructions.py --augment torch --caches  # and cache misses (~10 min a loop)
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

EVENTS = re.compile(r"Events +: ([\w ]+)\n.*Collected : ([\d ]+)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch size.")
    parser.add_argument("--train-size", type=int, default=6400, help="Samples in the train split (100 updates of 64).")
    parser.add_argument("--extra", type=int, default=2, help="Epochs the second count runs more than the first.")
    parser.add_argument("--augment", choices=["torch", "python"], help="As bench/torch_loop.py --augment.")
    parser.add_argument("--baseline-ref", metavar="REF", help="Also count the generated loop of REF's template.")
    parser.add_argument("--caches", action="store_true", help="Also count cache misses (callgrind's model of them).")
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


def count(args: argparse.Namespace, loop: str, epochs: int, template: Path) -> dict[str, int]:
    """Callgrind's events (Ir: instructions; with --caches, the misses too) that `loop` runs, rendering and
    set-up included, with 1 warmup + `epochs` epochs."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += ["--cache-sim=yes"] if args.caches else []
    command += [sys.executable, __file__, "--inner", loop, "--epochs", str(epochs), "--template", str(template)]
    command += ["--batch-size", str(args.batch_size), "--train-size", str(args.train_size)]
    command += ["--augment", args.augment] if args.augment else []
    result = subprocess.run(command, capture_output=True, text=True)
    found = EVENTS.search(result.stderr)
    if result.returncode != 0 or found is None:
        raise RuntimeError(f"{loop} under valgrind failed:\n{result.stderr[-3000:]}")
    return dict(zip(found[1].split(), map(int, found[2].split()), strict=True))


def per_update(args: argparse.Namespace, loop: str, template: Path) -> dict[str, float]:
    """Events per update of `loop`: the two counts' difference over the updates between them, and with
    --caches the estimated cycles ("cycles")."""
    with ThreadPoolExecutor(2) as pool:
        short, long = pool.map(lambda epochs: count(args, loop, epochs, template), (1, 1 + args.extra))
    updates = args.extra * -(-args.train_size // args.batch_size)
    events = {name: (long[name] - short[name]) / updates for name in long}
    if args.caches:
        events["first-level misses"] = events["I1mr"] + events["D1mr"] + events["D1mw"]
        events["last-level misses"] = events["ILmr"] + events["DLmr"] + events["DLmw"]
        events["cycles"] = events["Ir"] + 10 * events["first-level misses"] + 100 * events["last-level misses"]
    return events


def describe(events: dict[str, float]) -> str:
    """An update's instructions, and (--caches) its misses and estimated cycles."""
    text = f"{events['Ir'] / 1e6:8.3f} M instructions an update"
    if "cycles" in events:
        data = events["D1mr"] + events["D1mw"]
        text += f"; misses: first level {events['I1mr'] / 1e3:.1f}k instructions + {data / 1e3:.1f}k data"
        text += f", last level {events['last-level misses'] / 1e3:.1f}k; {events['cycles'] / 1e6:.3f} M cycles"
    return text


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
            print(f"{name:<13} {describe(counts[name])}", flush=True)
    print(
        f"\nbatch {args.batch_size}, train {args.train_size} samples, 1 + {args.extra} epochs counted; augmentation "
        f"{args.augment or 'off'}; template {template_revision()}"
    )
    measures = {"Ir": "the instructions of an update"}
    if args.caches:
        measures["cycles"] = "the estimated cycles of an update: the cache model's misses counted"
    for event, what in measures.items():
        hand, generated = counts["hand-written"][event], counts["generated"][event]
        print(f"hand-written / generated: {hand / generated:.3f}x ({what})")
        if "base" in counts:
            print(f"base / generated        : {counts['base'][event] / generated:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
