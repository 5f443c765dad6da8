"""What the loop benchmarks share: patching a rendered project, and the paired-rounds report.

Imports neither torch nor TensorFlow, so each benchmark needs only its own framework.
"""

import argparse
import contextlib
import statistics
import subprocess
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

Timings = list[tuple[float, float]]  # (wall seconds, process CPU seconds) of each timed epoch


class EpochClock:
    """Wall-clock and process CPU seconds of each epoch; CPU time is less hit by other processes."""

    def __init__(self) -> None:
        self.epochs: Timings = []

    def start(self) -> None:
        self.started = (time.perf_counter(), time.process_time())

    def stop(self) -> None:
        self.epochs.append((time.perf_counter() - self.started[0], time.process_time() - self.started[1]))


@contextlib.contextmanager
def patched(module: types.ModuleType, **attributes: object) -> Iterator[None]:
    """Set module attributes for the duration of a block, then restore them."""
    saved = {name: getattr(module, name) for name in attributes}
    for name, value in attributes.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


@contextlib.contextmanager
def pretend_tty(stream: object, enabled: bool) -> Iterator[None]:
    """Make `stream.isatty()` return True, so the template's ProgressBar draws as on a terminal."""
    if not enabled:
        yield
        return
    stream.isatty = lambda: True  # type: ignore[attr-defined]  # shadows the method on this one object
    try:
        yield
    finally:
        del stream.isatty  # type: ignore[attr-defined]


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A temporary git worktree of this repository at commit `ref`, removed after the block."""
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", folder, ref], check=True)
        try:
            yield Path(folder)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", folder], check=True)


def template_revision() -> str:
    """The commit the template was rendered from, and whether uncommitted template edits went in too."""
    git = ["git", "-C", str(REPO)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "templates"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" + uncommitted template edits" if dirty.stdout.strip() else "")


def rate(args: argparse.Namespace, epochs: Timings, clock: int) -> float:
    """Samples per second over `epochs`, by wall clock (clock 0) or process CPU time (clock 1)."""
    samples: int = args.train_size * len(epochs)
    return samples / sum(epoch[clock] for epoch in epochs)


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f} .. {max(values):,.0f}"


def print_comparison(args: argparse.Namespace, timings: dict[str, list[Timings]], targets: dict[str, str]) -> None:
    """The table of every loop, then the generated loop's ratio to each other loop.

    `targets` maps a baseline to the target its ratio is held to, as "1.0" (at least) or ">1.0".
    """
    # Per round: samples/s over its timed epochs. Best epoch: the fastest single epoch of any round,
    # the estimate least hurt by other processes (they can only slow an epoch down).
    wall = {name: [rate(args, epochs, 0) for epochs in rounds] for name, rounds in timings.items()}
    cpu = {name: [rate(args, epochs, 1) for epochs in rounds] for name, rounds in timings.items()}
    best = {
        name: max(rate(args, [epoch], 0) for epochs in rounds for epoch in epochs) for name, rounds in timings.items()
    }
    print(f"{'loop':<14}{'samples/s median':>18}{'min .. max':>22}{'best epoch':>12}{'per CPU-s median':>18}")
    for name in timings:
        print(
            f"{name:<14}{statistics.median(wall[name]):>18,.0f}{spread(wall[name]):>22}"
            f"{best[name]:>12,.0f}{statistics.median(cpu[name]):>18,.0f}"
        )
    for baseline in [name for name in timings if name != "generated"]:
        # Paired by round: the runs were back to back, so a ratio cancels slow phases of the machine.
        ratios = [g / b for g, b in zip(wall["generated"], wall[baseline], strict=True)]
        cpu_ratio = statistics.median(g / b for g, b in zip(cpu["generated"], cpu[baseline], strict=True))
        median = statistics.median(ratios)
        line = (
            f"generated / {baseline:<12}: {median:.3f}x median of rounds (range {min(ratios):.3f} .. "
            f"{max(ratios):.3f}), {best['generated'] / best[baseline]:.3f}x best epochs, {cpu_ratio:.3f}x CPU time"
        )
        target = targets.get(baseline)
        if target is not None:
            strict = target.startswith(">")
            bound = float(target.lstrip(">"))
            met = median > bound if strict else median >= bound
            line += f"  [{'meets' if met else 'below'} the target: {'above' if strict else 'at least'} {bound}x]"
        print(line)
