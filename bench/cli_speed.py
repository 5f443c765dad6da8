"""How fast is the looptpl command itself?

Times, in one run and in an order that alternates between rounds:
  * `looptpl new` end to end (render, `git init`, first commit), from this checkout,
  * plain `copier copy` of the same checkout with the same answers (no git init),
  * `looptpl new` as installed: the package with its template inside (as a wheel lays it out) and
    the per-user template store already set up,
  * plain `copier copy` from that store, at the same tag,
  * `looptpl --help` and one TAB completion (`--strategy `), against a bare `python -c pass`.
Targets: `looptpl new` under one second on a 2-core machine and no slower than `copier copy`;
`looptpl --help` under 0.3 s beyond the interpreter's own start-up. Medians of wall-clock time are
the figures; the CPU time of each command (its own and its git processes') is printed beside them,
because it moves less when other jobs share the machine. The load average is printed before and after.

    python bench/cli_speed.py [--rounds 7]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import looptpl

REPO = Path(__file__).resolve().parents[1]
ANSWERS = ["backend=torch", "strategy=ddp", "project_name=speed", "package_name=speed"]


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock and CPU seconds (user + system, children included) of one run of `command`."""
    before, started = os.times(), time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    wall, after = time.perf_counter() - started, os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def looptpl_bin() -> str:
    found = shutil.which("looptpl", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("error: looptpl is not installed in this environment; run `pip install -e .` first")
    return found


def fake_install(site: Path) -> None:
    """This checkout's looptpl laid out as its wheel installs it: the package, the template inside it."""
    package = site / "looptpl"
    shutil.copytree(REPO / "generator" / "looptpl", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "_template").mkdir()
    shutil.copy(REPO / "copier.yml", package / "_template")
    shutil.copytree(REPO / "templates", package / "_template" / "templates")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min) on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="Measurements of each command.")
    rounds = parser.parse_args().rounds
    looptpl_script = looptpl_bin()
    print(f"load before: {load()}")
    data = [item for answer in ANSWERS for item in ("--data", answer)]
    copier_copy = [sys.executable, "-m", "copier", "copy", "--quiet", "--defaults", *data]
    times: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        fake_install(scratch / "site")
        installed_env = {**os.environ, "PYTHONPATH": str(scratch / "site"), "LOOPTPL_HOME": str(scratch / "home")}
        installed = [sys.executable, "-m", "looptpl"]
        new_args = ["--backend", "torch", "--strategy", "ddp", "--name", "speed"]
        # Sets up the template store, once, as a user's first `looptpl new` does; later runs find it there.
        warmup = [*installed, "new", str(scratch / "warmup"), *new_args]
        subprocess.run(warmup, check=True, env=installed_env, capture_output=True)
        store, tag = scratch / "home" / "template", f"v{looptpl.__version__}"
        completion_env = {**os.environ, "_LOOPTPL_COMPLETE": "complete_bash", "COMP_CWORD": "4"}
        completion_env["COMP_WORDS"] = "looptpl new proj --strategy "
        for round_index in range(rounds):
            destination = scratch / str(round_index)
            commands = {
                "looptpl new": ([looptpl_script, "new", str(destination / "new"), *new_args], os.environ),
                "copier copy": ([*copier_copy, "--vcs-ref", "HEAD", str(REPO), str(destination / "copy")], os.environ),
                "looptpl new, installed": (
                    [*installed, "new", str(destination / "new-installed"), *new_args],
                    installed_env,
                ),
                "copier copy, store": (
                    [*copier_copy, "--vcs-ref", tag, str(store), str(destination / "copy-store")],
                    os.environ,
                ),
                "looptpl --help": ([looptpl_script, "--help"], os.environ),
                "TAB completion": ([looptpl_script], completion_env),
                "python -c pass": ([sys.executable, "-c", "pass"], os.environ),
            }
            order = list(commands) if round_index % 2 == 0 else list(reversed(commands))
            for name in order:
                command, env = commands[name]
                times.setdefault(name, []).append(timed(command, dict(env)))
    median = {name: statistics.median(wall for wall, _ in values) for name, values in times.items()}
    cpu = {name: statistics.median(used for _, used in values) for name, values in times.items()}
    print(f"load after:  {load()}")
    print(f"{'command':<24} {'median s':>9} {'CPU s':>7}  all rounds (s)")
    for name, values in times.items():
        rounds_text = " ".join(f"{wall:.3f}" for wall, _ in values)
        print(f"{name:<24} {median[name]:>9.3f} {cpu[name]:>7.3f}  {rounds_text}")
    start = median["python -c pass"]
    new, installed_new = median["looptpl new"], median["looptpl new, installed"]
    ratio, installed_ratio = new / median["copier copy"], installed_new / median["copier copy, store"]
    print(f"looptpl new / copier copy: {ratio:.2f}x from the checkout, {installed_ratio:.2f}x installed (target <= 1x)")
    print(f"looptpl new: {new:.2f} s from the checkout, {installed_new:.2f} s installed (target < 1 s)")
    print(f"looptpl --help beyond interpreter start-up: {median['looptpl --help'] - start:.3f} s (target < 0.3 s)")
    print(f"TAB completion beyond interpreter start-up: {median['TAB completion'] - start:.3f} s")


if __name__ == "__main__":
    main()
