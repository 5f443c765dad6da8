"""How fast is the looptpl command itself?

Times, in one run and in alternating order:
  * `looptpl new` end to end (render, `git init`, first commit),
  * plain `copier copy` of the same template with the same answers (no git init),
  * `looptpl --help`, against a bare `python -c pass` start-up.
Targets: `looptpl new` under one second on a 2-core machine and no slower than `copier copy`;
`looptpl --help` under 0.3 s beyond the interpreter's own start-up.

    python bench/cli_speed.py [--rounds 5]
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ANSWERS = ["backend=torch", "strategy=ddp", "project_name=speed", "package_name=speed"]


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def looptpl_bin() -> str:
    found = shutil.which("looptpl", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("error: looptpl is not installed in this environment; run `pip install -e .` first")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="Measurements of each command.")
    rounds = parser.parse_args().rounds
    looptpl = looptpl_bin()
    times: dict[str, list[float]] = {"looptpl new": [], "copier copy": [], "looptpl --help": [], "python -c pass": []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(rounds):
            new_dest, copy_dest = Path(scratch) / f"new{round_index}", Path(scratch) / f"copy{round_index}"
            new = [looptpl, "new", str(new_dest), "--backend", "torch", "--strategy", "ddp", "--name", "speed"]
            data = [item for answer in ANSWERS for item in ("--data", answer)]
            copy = [sys.executable, "-m", "copier", "copy", "--quiet", "--defaults", "--vcs-ref", "HEAD", *data]
            commands = {
                "looptpl new": new,
                "copier copy": [*copy, str(REPO), str(copy_dest)],
                "looptpl --help": [looptpl, "--help"],
                "python -c pass": [sys.executable, "-c", "pass"],
            }
            order = list(commands) if round_index % 2 == 0 else list(reversed(commands))
            for name in order:
                times[name].append(timed(commands[name]))
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"{'command':<16} {'median s':>9}  all rounds (s)")
    for name, values in times.items():
        print(f"{name:<16} {median[name]:>9.3f}  {' '.join(f'{value:.3f}' for value in values)}")
    help_cost = median["looptpl --help"] - median["python -c pass"]
    print(f"looptpl new / copier copy: {median['looptpl new'] / median['copier copy']:.2f}x (target <= 1.00x)")
    print(f"looptpl new: {median['looptpl new']:.2f} s (target < 1 s)")
    print(f"looptpl --help beyond interpreter start-up: {help_cost:.3f} s (target < 0.3 s)")


if __name__ == "__main__":
    main()
