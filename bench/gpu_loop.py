"""Training throughput on a GPU: generated projects against hand-written loops, Lightning and Accelerate.

One command, on a machine with a GPU and looptpl installed (from the repository root):

    python bench/gpu_loop.py                          # GPT ~30M, bf16, 5 paired rounds (~5 minutes)
    python bench/gpu_loop.py --model gpt125m --release-memory
    python bench/gpu_loop.py --model cnn
    python bench/gpu_loop.py --model tiny --device cpu --precision fp32 --rounds 1 --steps 4   # a check, seconds

It renders `single`, `ddp` and `fsdp` projects with `looptpl new` (or takes those under --projects,
rendered before with --prepare on a machine that has looptpl), starts one worker process per loop
(bench/gpu_loops.py says what each runs), lets each train an untimed warm-up epoch, then runs
--rounds rounds in which every loop trains one timed epoch in turn, in an order that rotates.
The table gives medians over rounds; the ratios are paired by round (both loops ran within
seconds of each other), with their range. MFU is achieved training FLOP/s over the GPU's dense
bf16 peak from its datasheet. `ddp` and `fsdp` run as one process; on a machine with N GPUs (or
with --ranks N), `ddp-xN` and `fsdp-xN` also train the same global batch on N processes under
torchrun, one GPU each, and their ratio to `single` is the speed-up of N GPUs (N at best).

Targets (issue #14, medians on one H100): generated >= 1.05x hand-written and Lightning, compiled
>= 1.0x hand-written compiled, fsdp at one rank >= 0.9x single.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from timing import checkout, template_revision

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
BASE_LOOPS = ["ceiling", "ceiling-compiled", "hand", "hand-compiled", "lightning", "accelerate"]
GENERATED = {"single": "single:", "single-compiled": "single:--compile", "ddp": "ddp:", "fsdp": "fsdp:"}
COMPARISONS = [  # (loop, against): printed when both ran
    ("single", "ceiling"), ("single", "hand"), ("single", "lightning"), ("single", "accelerate"),
    ("single-compiled", "ceiling-compiled"), ("single-compiled", "hand-compiled"),
    ("hand", "ceiling"), ("lightning", "hand"), ("accelerate", "hand"), ("hand-compiled", "ceiling-compiled"),
    ("ddp", "single"), ("fsdp", "single"),
]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt30m", help="gpt30m, gpt125m, cnn, or tiny / tiny-cnn for a CPU check.")
    parser.add_argument("--rounds", type=int, default=5, help="Timed epochs of every loop, one per round.")
    parser.add_argument("--steps", type=int, default=100, help="Optimizer updates in an epoch.")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="Untimed epochs before the rounds.")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument(
        "--loops",
        default=",".join(BASE_LOOPS + list(GENERATED)),
        help="Comma-separated loops to run; names from bench/gpu_loops.py and the generated ones "
        f"({', '.join(GENERATED)}). Loops whose package is missing (Lightning, Accelerate) are skipped with a note.",
    )
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="NAME=PROJECT:FLAGS",
        help="Another generated loop: the project folder under --projects and the flags it trains with, "
        'e.g. "workers=single:--num-workers 2". Compared against `single`.',
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=0,
        help="Also time ddp and fsdp on this many processes (torchrun), as ddp-xN and fsdp-xN. 0: every GPU when "
        "there are several. On the CPU the ranks share its cores: a check of the bench, not a measurement.",
    )
    parser.add_argument("--projects", type=Path, help="Take the rendered projects from here instead of rendering.")
    parser.add_argument(
        "--prepare",
        type=Path,
        metavar="DIR",
        help="Only render the projects into DIR (for a GPU machine without looptpl).",
    )
    parser.add_argument(
        "--baseline-ref",
        metavar="GIT_REF",
        help="With --prepare: also render `single` from this commit of the repository as project `base`, timed "
        "as loop `base` (add it to --loops) against `single`.",
    )
    parser.add_argument(
        "--release-memory", action="store_true", help="Each worker empties its CUDA cache after its epoch (big models)."
    )
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="LOOP",
        help="After the rounds, train one more epoch of LOOP under cProfile and print where its host time went.",
    )
    parser.add_argument("--json", type=Path, help="Also write every round's figures here.")
    parser.add_argument("--logs", type=Path, help="Keep each worker's output in this folder.")
    # A worker process's own arguments (set by the driver).
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--project", help=argparse.SUPPRESS)
    parser.add_argument("--flags", type=shlex.split, default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.ranks < 0:
        parser.error("--ranks must not be negative")
    return args


# --- rendering -----------------------------------------------------------------------------------


def render(destination: Path, strategy: str, template: Path = REPO) -> None:
    """`looptpl new` a torch project from the looptpl of `template` (a checkout), with the benchmark's step.py."""
    # The checkout's own generator renders its own template. The project is written outside every checkout
    # first: copier reads a checkout's template through git, and files inside it would make it dirty.
    environment = {**os.environ, "PYTHONPATH": str(template / "generator")}
    name = f"bench_{destination.name}".replace("-", "_")
    with tempfile.TemporaryDirectory() as scratch:
        project = Path(scratch) / destination.name
        command = [sys.executable, "-m", "looptpl", "new", str(project), "--backend", "torch", "--strategy", strategy]
        command += ["--name", name, "--defaults", "--no-git"]
        subprocess.run(command, check=True, env=environment, stdout=subprocess.DEVNULL)
        (package,) = [path for path in (project / "src").iterdir() if (path / "train.py").exists()]
        (package / "step.py").write_text(STEP_PY)
        shutil.move(project, destination)


STEP_PY = '''"""The benchmark's step: mean cross-entropy over tokens (the GPT's dict batches) or images."""

from typing import Any

from gpu_workloads import losses
from torch import nn

from .kit.api import Gather, Mean, evaluation
from .kit.config import TrainConfig


def train_step(model: nn.Module, batch: Any, config: TrainConfig) -> Mean:
    return Mean(losses(model, batch), per="token" if isinstance(batch, dict) else "sample")


def eval_step(model: nn.Module, batch: Any, config: TrainConfig) -> dict[str, Mean | Gather]:
    return evaluation(loss=train_step(model, batch, config), metrics={})
'''


def prepare(folder: Path, baseline_ref: str | None) -> None:
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    for strategy in ("single", "ddp", "fsdp"):
        if not (folder / strategy).exists():
            render(folder / strategy, strategy)
    if baseline_ref and not (folder / "base").exists():
        with checkout(baseline_ref) as template:
            render(folder / "base", "single", template)
    print(f"rendered {', '.join(sorted(path.name for path in folder.iterdir()))} into {folder}")


# --- the driver ----------------------------------------------------------------------------------


@dataclass
class Loop:
    """One worker process and what it reported."""

    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    pending: bytes = b""
    rounds: list[dict[str, float]] = field(default_factory=list)
    failed: str = ""

    def start(self) -> None:
        # A compile cache of its own: workers that compile the same model at once were seen to break each other's.
        caches = self.log.parent / f"{self.name}-caches"
        environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor")}
        environment["TRITON_CACHE_DIR"] = str(caches / "triton")
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=environment,
        )

    def send(self, line: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass

    def expect(self, prefix: str, timeout: float) -> str | None:
        """The rest of the worker's next line that starts with `prefix`; None if it died or took too long."""
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + timeout
        with self.log.open("ab") as log:
            while True:
                while b"\n" in self.pending:
                    line, self.pending = self.pending.split(b"\n", 1)
                    text = line.decode(errors="replace")
                    if text.startswith(prefix):
                        return text[len(prefix) :].strip()
                    log.write(line + b"\n")
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self.process.stdout], [], [], max(left, 0))
                chunk = os.read(self.process.stdout.fileno(), 65536) if ready else b""
                if not chunk:
                    self.process.kill()
                    log.write(self.pending)
                    log.flush()
                    self.failed = "timed out" if not ready else f"exited with {self.process.wait()}"
                    tail = self.log.read_text(errors="replace").strip().splitlines()[-12:]
                    self.failed += ", its output ended with:\n    " + "\n    ".join(tail)
                    return None
                self.pending += chunk


def worker_command(
    args: argparse.Namespace, worker: str, project: Path | None = None, flags: str = "", ranks: int = 1
) -> list[str]:
    """The worker's command line: one process, or `ranks` processes under torchrun (rank 0 talks to the driver)."""
    launcher = [sys.executable]
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    command = [*launcher, str(BENCH / "gpu_loop.py"), "--worker", worker]
    command += ["--model", args.model, "--steps", str(args.steps), "--rounds", str(args.rounds)]
    command += ["--warmup-epochs", str(args.warmup_epochs), "--device", args.device, "--precision", args.precision]
    command += ["--lr", str(args.lr), "--weight-decay", str(args.weight_decay)]
    command += ["--release-memory"] if args.release_memory else []
    if project is not None:
        command += ["--project", str(project), f"--flags={flags}"]
    return command


def build_loops(args: argparse.Namespace, projects: Path, logs: Path) -> tuple[list[Loop], list[str]]:
    """The loops asked for, and a note for each one skipped."""
    generated = dict(GENERATED, **({"base": "base:"} if (projects / "base").exists() else {}))
    for spec in args.extra:
        name, _, target = spec.partition("=")
        generated[name] = target
    names = [name for name in args.loops.split(",") if name] + [spec.partition("=")[0] for spec in args.extra]
    spread = spread_loops(args, names)
    names += list(spread)
    loops, skipped = [], []
    for name in dict.fromkeys(names):
        if name in generated or name in spread:
            project, _, flags = generated[spread.get(name, name)].partition(":")
            if not (projects / project).exists():
                skipped.append(f"{name}: no project {project!r} under {projects}")
                continue
            if name in spread:  # ranks 1..N-1 wait in a collective while the other loops train: let them wait
                flags += " --dist-timeout-s 3600"
            ranks = several_ranks(args) if name in spread else 1
            command = worker_command(args, "generated", projects / project, flags, ranks)
        elif name.removesuffix("-compiled") in ("ceiling", "hand", "lightning", "accelerate"):
            package = {"lightning": "lightning", "accelerate": "accelerate"}.get(name.removesuffix("-compiled"))
            if package and not _installed(package):
                skipped.append(f"{name}: the {package} package is not installed")
                continue
            command = worker_command(args, name)
        else:
            sys.exit(f"error: --loops names {name!r}, which is no loop; see --help")
        loops.append(Loop(name, command, logs / f"{name}.log"))
    return loops, skipped


def spread_loops(args: argparse.Namespace, names: list[str]) -> dict[str, str]:
    """The ddp-xN and fsdp-xN loops, by name, each with the loop it runs on N processes."""
    ranks = several_ranks(args)
    return {f"{strategy}-x{ranks}": strategy for strategy in ("ddp", "fsdp") if ranks and strategy in names}


def several_ranks(args: argparse.Namespace) -> int:
    """How many processes the ddp-xN and fsdp-xN loops train on; 0 for none."""
    if args.ranks:
        return args.ranks if args.ranks > 1 else 0
    if args.device != "cuda":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.device_count() > 1 else 0


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def run_rounds(args: argparse.Namespace, loops: list[Loop]) -> None:
    started = time.perf_counter()
    for loop in loops:  # warm-ups (and compilation) run side by side; untimed
        loop.start()
    for loop in loops:
        if loop.expect("READY", timeout=1800) is None:
            print(f"{loop.name}: failed before its first round ({loop.failed})", flush=True)
    print(f"warm-up: {time.perf_counter() - started:.0f} s", flush=True)
    alive = [loop for loop in loops if not loop.failed]
    for round_index in range(args.rounds):
        shift = round_index % max(len(alive), 1)
        for loop in alive[shift:] + alive[:shift]:
            if loop.failed:
                continue
            loop.send("epoch")
            result = loop.expect("RESULT ", timeout=1800)
            if result is None:
                print(f"{loop.name}: failed in round {round_index + 1} ({loop.failed})", flush=True)
                continue
            figures = json.loads(result)
            loop.rounds.append(figures)
            rate = figures["samples"] / figures["seconds"]
            print(
                f"[round {round_index + 1}/{args.rounds}] {loop.name:<18} {rate:>10,.1f} samples/s  "
                f"{figures['seconds']:.3f} s",
                flush=True,
            )
    for loop in loops:
        if loop.name in args.profile and not loop.failed:
            loop.send("profile")
            profile = loop.expect("PROFILE ", timeout=1800)
            if profile is None:
                print(f"{loop.name}: failed while profiling ({loop.failed})", flush=True)
            else:
                print(f"\nwhere one epoch of {loop.name} spent its host time:\n{json.loads(profile)}", flush=True)
    for loop in loops:
        if loop.process is not None and loop.process.poll() is None:
            loop.send("quit")
            try:
                loop.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                loop.process.kill()


def header(args: argparse.Namespace, skipped: list[str]) -> str:
    import torch
    from gpu_workloads import PRESETS, flops_per_sample, units_per_sample

    shape = PRESETS[args.model]
    versions = [f"torch {torch.__version__}"]
    for package in ("lightning", "accelerate"):
        with contextlib.suppress(ImportError):
            versions.append(f"{package} {__import__(package).__version__}")
    device = "CPU " + platform.processor()
    if args.device == "cuda" and torch.cuda.is_available():
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
        device = f"{torch.cuda.get_device_name()} (driver {driver or '?'}, CUDA {torch.version.cuda})"
    units = units_per_sample(shape)
    size = f"global batch {shape.batch}" + (f" x {units} tokens" if units > 1 else "")
    weights = sum(parameter.numel() for parameter in __import__("gpu_workloads").build_model(shape).parameters())
    lines = [
        f"device: {device}; {', '.join(versions)}; template {template_revision()}",
        f"workload: {args.model} ({weights / 1e6:.1f}M weights, {flops_per_sample(shape) / 1e9:.2f} GFLOP per "
        f"training sample), {size}, {args.precision}, {args.steps} updates an epoch, {args.rounds} rounds",
    ]
    lines += [f"skipped {note}" for note in skipped]
    return "\n".join(lines)


def report(args: argparse.Namespace, loops: list[Loop], skipped: list[str]) -> None:
    import torch
    from gpu_workloads import PRESETS, flops_per_sample, peak_tflops, units_per_sample

    shape = PRESETS[args.model]
    flops, units = flops_per_sample(shape), units_per_sample(shape)
    peak = peak_tflops(torch.cuda.get_device_name()) if args.device == "cuda" and torch.cuda.is_available() else None
    print("\n" + header(args, skipped))
    rates = {loop.name: [r["samples"] / r["seconds"] for r in loop.rounds] for loop in loops if loop.rounds}
    print(f"{'loop':<20}{'samples/s':>12}{'min .. max':>22}{'tokens/s':>12}{'MFU':>8}{'peak GiB':>10}")
    for loop in loops:
        if loop.name not in rates:
            print(f"{loop.name:<20}  failed: {loop.failed}")
            continue
        median = statistics.median(rates[loop.name])
        mfu = f"{median * flops / (peak * 1e12):.1%}" if peak else "-"
        tokens = f"{median * units:,.0f}" if units > 1 else "-"
        memory = max(r["peak_bytes"] for r in loop.rounds) / 2**30
        spread = f"{min(rates[loop.name]):,.1f} .. {max(rates[loop.name]):,.1f}"
        print(f"{loop.name:<20}{median:>12,.1f}{spread:>22}{tokens:>12}{mfu:>8}{memory:>10.2f}")
    against_single = {spec.partition("=")[0] for spec in args.extra} | set(spread_loops(args, args.loops.split(",")))
    extras = [(name, "single") for name in rates if name == "base" or name in against_single]
    for name, against in COMPARISONS + extras:
        if name in rates and against in rates and len(rates[name]) == len(rates[against]):
            ratios = [a / b for a, b in zip(rates[name], rates[against], strict=True)]
            print(
                f"{name} / {against}: {statistics.median(ratios):.3f}x median of rounds "
                f"(range {min(ratios):.3f} .. {max(ratios):.3f})"
            )
    if args.json:
        figures = {loop.name: loop.rounds for loop in loops}
        args.json.write_text(json.dumps({"header": header(args, skipped), "rounds": figures}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(BENCH))
    if args.worker:
        from gpu_loops import main_worker

        main_worker(args)
        return 0
    if args.prepare:
        prepare(args.prepare, args.baseline_ref)
        return 0
    work = Path(tempfile.mkdtemp(prefix="looptpl-gpu-bench-"))
    projects = args.projects
    if projects is None:
        projects = work / "projects"
        prepare(projects, args.baseline_ref)
    logs = args.logs or work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    loops, skipped = build_loops(args, projects.resolve(), logs)
    for note in skipped:
        print(f"skipped {note}", flush=True)
    try:
        run_rounds(args, loops)
    finally:
        for loop in loops:
            if loop.process is not None and loop.process.poll() is None:
                loop.process.kill()
    report(args, loops, skipped)
    if args.logs is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(loop.rounds for loop in loops) else 1


if __name__ == "__main__":
    sys.exit(main())
