"""A folder per run: `{start}` in --run-dir becomes the time the run started. Managed by the looptpl template.

`--run-dir runs/{start}` (the default) gives every run a folder of its own, runs/2026-11-26_09-30-00
(runs/2026-11-26_09-30-00-2 for a second run started in the same second), links runs/latest to the
newest, and `--resume` continues the newest of them that holds a checkpoint. A --run-dir without
`{start}` is one fixed folder.

Every rank must name the same folder, so rank 0 chooses it and sends the others a number (`code`):
the start time's digits, YYYYMMDDhhmmss, times 100, plus the run's number within that second.
"""

import glob
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from .errors import ConfigError

START = "{start}"
_STAMP = r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d"


def choose_folder(
    pattern: str,
    *,
    resume: bool,
    restarted: bool,
    holds_run: Callable[[Path], bool],
    chooses: bool,
    share: Callable[[int], int],
    chooser: str,
) -> Path:
    """The folder `{start}` names: with --resume (or after a restart) the newest that holds a run, else
    a new one. The process that `chooses` (rank 0, the chief) decides from what it sees on disk, and
    `share` (a collective: every process calls this) gives its choice to all; `chooser` names it."""
    code, problem = 0, ""
    if chooses:
        if resume or restarted:
            code = newest(pattern, holds_run)
        if not code and not resume:
            try:
                code = claim_new(pattern)
            except OSError as error:
                reason = error.strerror or error
                problem = f"cannot create a folder for --run-dir {pattern} ({reason}); choose one you can write to"
    code = share(-1 if problem else code)
    if code == -1:
        raise ConfigError(problem or f"{chooser} cannot create a folder for --run-dir {pattern}; see its line")
    if code == 0:
        raise ConfigError(
            f"--resume: no folder matching --run-dir {pattern} holds a checkpoint; drop --resume to start a run"
        )
    return folder_of(pattern, code)


def pattern_problem(run_dir: str) -> str:
    """What is wrong with a --run-dir as a name pattern, or ''."""
    rest = run_dir.replace(START, "", 1)
    return "may hold {start} once and no other braces" if "{" in rest or "}" in rest else ""


def folder_of(pattern: str, code: int) -> Path:
    """The folder a code names: `{start}` replaced by its start time (and number, from the second on)."""
    digits, number = f"{code // 100:014d}", code % 100
    start = f"{digits[:4]}-{digits[4:6]}-{digits[6:8]}_{digits[8:10]}-{digits[10:12]}-{digits[12:]}"
    return Path(pattern.replace(START, start + (f"-{number}" if number > 1 else "")))


def newest(pattern: str, holds_run: Callable[[Path], bool]) -> int:
    """The code of the newest folder matching `pattern` that holds a run to resume; 0 if there is none."""
    head, tail = pattern.split(START, 1)
    shape = re.compile(re.escape(head) + f"({_STAMP})(?:-(\\d+))?" + re.escape(tail))
    codes = []
    for name in glob.glob(glob.escape(head) + "*" + glob.escape(tail)):
        found = shape.fullmatch(name)
        if found and holds_run(Path(name)):
            codes.append(int(re.sub(r"\D", "", found[1])) * 100 + int(found[2] or 1))
    return max(codes, default=0)


def claim_new(pattern: str) -> int:
    """Create a new folder for a run starting now and return its code (OSError if it cannot be created).

    Creating it is what claims it: two runs started in the same second take the next numbers.
    """
    stamp = int(time.strftime("%Y%m%d%H%M%S"))
    for number in range(1, 100):
        folder = folder_of(pattern, stamp * 100 + number)
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue
        if pattern.endswith(START):
            _link_latest(folder)
        return stamp * 100 + number
    raise FileExistsError(f"{folder_of(pattern, stamp * 100 + 1)}: 99 runs started in this second already")


def _link_latest(folder: Path) -> None:
    """Point `latest` beside the run folders at this one (runs/latest -> 2026-11-26_09-30-00), in one step."""
    link, spare = folder.parent / "latest", folder.parent / f".latest-{os.getpid()}"
    try:
        spare.unlink(missing_ok=True)
        spare.symlink_to(folder.name, target_is_directory=True)
        os.replace(spare, link)  # a run directory named `latest` is a folder, not a link: left alone
    except OSError:
        spare.unlink(missing_ok=True)  # no symbolic links on this file system: the run goes on without one


def opening_line(run_dir: Path, where: str, weights: int, samples: int | None, shape: tuple[int, int, int]) -> str:
    """What a run prints once its model and data are built: where it trains, and how much.

    `shape` is (epochs, updates an epoch, samples an update); `samples` None for a stream.
    """
    epochs, updates, batch = shape
    data = f"{samples:,} training samples" if samples is not None else "a stream of training samples"
    plural = "s" if epochs != 1 else ""
    return (
        f"run {run_dir}: {where}, {_count(weights)} weights, {data}; "
        f"{epochs} epoch{plural} of {updates:,} updates of {batch:,} samples"
    )


def _count(number: int) -> str:
    """53636 -> 53.6k, 29_500_000 -> 29.5M."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if number >= size:
            return f"{number / size:.1f}{unit}"
    return str(number)


def closing_lines(summary: dict[str, object], run_dir: Path, seconds: float, package: str) -> list[str]:
    """What the end of a run prints: the summary (numbers rounded, summary.json keeps them whole), then
    where everything is and what to run next."""
    width = max(map(len, summary))
    lines = [f"{name:<{width}}  {_rounded(value)}" for name, value in summary.items()]
    minutes, rest = divmod(round(seconds), 60)
    lines += [
        "",
        f"run folder   {run_dir}  (took {f'{minutes} min {rest} s' if minutes else f'{rest} s'})",
        f"checkpoints  {run_dir / 'checkpoints'}",
        f"plot         python -m {package}.kit.plot {run_dir}",
    ]
    return lines


def _rounded(value: object) -> object:
    """A float at 4 significant digits (0.7669050665015719 -> 0.7669, 32081.7 -> 32082), else as it is."""
    if not isinstance(value, float):
        return value
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
