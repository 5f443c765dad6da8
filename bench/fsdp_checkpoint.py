"""Checkpoint save time and peak host memory of a torch/fsdp project: sharded, and in the background, against whole.

Renders a torch/fsdp project with `looptpl new`, then runs this file under
`torchrun --nproc-per-node N` (gloo, on the CPU). Every rank builds the project's own model
(model.py's MLP, widened with --hidden-size), shards it with the project's `wrap_model`, takes one
AdamW update so the optimizer holds its two moments, and then saves checkpoints with the
project's own `Checkpointer` once, in a fresh set of processes for each save and mode, the
modes taking turns in every round:

  whole    the gather of the whole model and optimizer state on rank 0, written by rank 0 as one
           file: what every strategy did before sharded checkpoints, and what fsdp does on one rank
  sharded  every rank writes its own shards with torch.distributed.checkpoint (sharded.py)
  background  sharded, with --async-checkpoints: `save` copies the shards to host memory and
           returns; a thread writes them, and `finish` waits for it

Save time is the wall time from a barrier until the checkpoint is complete (`Checkpointer.save`,
then `finish`) on the slowest rank; the time training waits is that of `save` alone (all of it,
but for the background mode); peak memory is the rise of each rank's resident set (VmHWM after
clearing it, minus VmRSS before) during the save. The ratios are paired by round: sharded / whole,
background / sharded.

Run from the repository root (about 1 minute on 2 idle CPU cores):
    .venv/bin/python bench/fsdp_checkpoint.py
    .venv/bin/python bench/fsdp_checkpoint.py --hidden-size 2048 --ranks 2 --rounds 5
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import REPO, template_revision

MODES = ("whole", "sharded", "background")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden-size", type=int, default=4096, help="Width of the MLP's hidden layers.")
    parser.add_argument("--ranks", type=int, default=2, help="Processes torchrun starts.")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds; each saves once in every mode.")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # the rendered project, under torchrun
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # the worker's way of saving
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        project = Path(scratch) / "fsdp"
        looptpl = shutil.which("looptpl", path=str(Path(sys.executable).parent)) or "looptpl"
        render = [looptpl, "new", str(project), "--backend", "torch", "--strategy", "fsdp", "--defaults", "--no-git"]
        subprocess.run(render, check=True, capture_output=True)
        for index in range(args.rounds):
            record: dict[str, object] = {}
            for mode in MODES if index % 2 == 0 else reversed(MODES):  # alternate the order
                # A fresh set of processes for every save: memory freed by an earlier save would hide a peak.
                command = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    f"--nproc-per-node={args.ranks}",
                ]
                command += [__file__, "--worker", str(project), "--mode", mode, "--hidden-size", str(args.hidden_size)]
                environment = {**os.environ, "OMP_NUM_THREADS": "1"}
                result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
                if result.returncode != 0:
                    sys.exit(f"the benchmark's ranks failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
                [line] = [line for line in result.stdout.splitlines() if line.startswith("{")]
                record[mode] = json.loads(line)
            rounds.append(record)
    report(args, rounds)


def worker(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(args.worker / "src"))
    package = "fsdp"
    distributed = importlib.import_module(f"{package}.distributed")
    flags = ["--device", "cpu", "--run-dir", str(args.worker / "run"), "--hidden-size", str(args.hidden_size)]
    flags += ["--keep-checkpoints", "1"] + (["--async-checkpoints"] if args.mode == "background" else [])
    config = importlib.import_module(f"{package}.kit.config").parse_config(flags)
    runtime = distributed.setup(config)
    model = distributed.wrap_model(importlib.import_module(f"{package}.model").build_model(config), runtime)
    optimizer = importlib.import_module(f"{package}.optim").build_optimizer(model, config)
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
    optimizer.step()  # the optimizer now holds both moments, as it does in any checkpoint
    checkpointer = importlib.import_module(f"{package}.kit.checkpoint").Checkpointer(
        args.worker / "run", runtime, config, model, [optimizer], None
    )
    checkpointer.sharded = args.mode != "whole"
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak resident set, to now
    before = _status("VmRSS")
    distributed.barrier()
    started = time.perf_counter()
    checkpointer.save({"epoch": 0}, f"epoch-0000-{args.mode}", False)
    waited = time.perf_counter() - started
    checkpointer.finish()
    seconds = time.perf_counter() - started
    peak = _status("VmHWM") - before
    gathered = [torch.zeros(3, dtype=torch.float64) for _ in range(runtime.world_size)]
    torch.distributed.all_gather(gathered, torch.tensor([seconds, peak, waited], dtype=torch.float64))
    if runtime.is_main:
        written = checkpointer.checkpoints()[-1]
        size = sum(f.stat().st_size for f in written.rglob("*")) if written.is_dir() else written.stat().st_size
        record = {
            "seconds": max(float(values[0]) for values in gathered),
            "waited": max(float(values[2]) for values in gathered),
            "peak_mib": [float(values[1]) / 2**20 for values in gathered],
            "size_mib": size / 2**20,
        }
        print(json.dumps(record), flush=True)
        files = importlib.import_module(f"{package}.kit.files")
        files.remove(written)
    distributed.teardown(wait_for_others=True)


def _status(field: str) -> int:
    """A field of /proc/self/status in bytes (VmRSS: resident now, VmHWM: its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def report(args: argparse.Namespace, rounds: list[dict]) -> None:
    import torch

    machine = f"{args.ranks} ranks (gloo, CPU), {os.cpu_count()} CPUs"
    print(f"torch {torch.__version__}, {machine}, template {template_revision()}")
    print(f"model: the project's MLP at --hidden-size {args.hidden_size}; {len(rounds)} rounds, medians")
    print(
        f"{'mode':<12}{'save s':>10}{'waits s':>10}{'checkpoint MiB':>16}"
        + "".join(f"{f'rank {r} peak MiB':>18}" for r in range(args.ranks))
    )
    for mode in MODES:
        seconds = statistics.median(record[mode]["seconds"] for record in rounds)
        waited = statistics.median(record[mode]["waited"] for record in rounds)
        size = statistics.median(record[mode]["size_mib"] for record in rounds)
        peaks = [statistics.median(record[mode]["peak_mib"][rank] for record in rounds) for rank in range(args.ranks)]
        print(f"{mode:<12}{seconds:>10.3f}{waited:>10.3f}{size:>16.1f}" + "".join(f"{peak:>18.1f}" for peak in peaks))
    for mode, baseline in (("sharded", "whole"), ("background", "sharded")):
        for measure, words in (("seconds", "save time"), ("waited", "time training waits")):
            ratios = [record[mode][measure] / record[baseline][measure] for record in rounds]
            spread = f"range {min(ratios):.3f} .. {max(ratios):.3f}"
            print(f"{words} {mode} / {baseline}: {statistics.median(ratios):.3f}x ({spread})")
        for rank in range(args.ranks):
            ratios = [
                record[mode]["peak_mib"][rank] / max(record[baseline]["peak_mib"][rank], 1e-9) for record in rounds
            ]
            print(f"rank {rank} peak memory {mode} / {baseline}: {statistics.median(ratios):.3f}x")
    print(f"repository: {REPO}")


if __name__ == "__main__":
    main()
