"""Shared helpers: render projects through the CLI and run commands with hard timeouts."""

import atexit
import importlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from looptpl.cli import app
from looptpl.variants import VARIANTS, Variant

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO_ROOT / "templates" / "shared" / "tests"))
# What training runs fork from (see `run`), as the generated projects' tests preload it (torch._dynamo: see there).
TORCH = ("torch", "torch.distributed.checkpoint.state_dict", "torch._dynamo")
TENSORFLOW = ("tensorflow",)

# The JAX runs of this process (a pytest-xdist worker) share one compilation cache, as the generated JAX projects'
# tests do (templates/jax/tests/conftest.py): a run reads back the update an earlier run compiled.
JAX_CACHE = tempfile.mkdtemp(prefix="jax-compilation-cache-")
atexit.register(shutil.rmtree, JAX_CACHE, ignore_errors=True)
os.environ["JAX_COMPILATION_CACHE_DIR"] = JAX_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"


# Modules with the most training first, so pytest-xdist's two workers (pyproject.toml: loadscope, in collection
# order) start on the long ones and the short ones fill in at the end; a module not named here comes after these.
LONGEST_FIRST = (
    "test_all_variants_pass_their_own_tests.py",
    "test_contract.py",
    "test_contract_tf.py",
    "test_update.py",
    "test_examples.py",
    "test_streaming_tf.py",
    "test_streaming.py",
    "test_docs.py",
    "test_generated_projects.py",
    "test_backend_parity.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: a module's tests keep their order


def looptpl(*args: str) -> "CliResult":
    """Run the CLI in-process with stdin that is not a terminal (so nothing is asked)."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


class CliResult:
    def __init__(self, exit_code: int, stdout: str, stderr: str) -> None:
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr


def run(
    command: list[str],
    cwd: Path,
    timeout: float = 900,
    env: dict[str, str] | None = None,
    preload: tuple[str, ...] = (),
    ranks: int = 1,
) -> subprocess.CompletedProcess:
    """Run a command to completion; kill its whole process group if it outlives `timeout`.

    With `preload` (the framework's modules), a training run (`python -m PKG.train ...`, or torchrun's
    agent, whose ranks are new processes) is forked from a process that imported them once, as the
    generated tests start their runs (templates/shared/tests/forked_runs.py); with `ranks`, that many
    processes of it, each given the variables torchrun gives its ranks.
    """
    environment = {**os.environ, **(env or {})}
    if preload and command[1:2] == ["-m"] and (command[2].endswith(".train") or command[2] == "torch.distributed.run"):
        return run_forked(command, cwd, timeout, environment, preload, ranks)
    assert ranks == 1, "only a forked training run starts its ranks itself"
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=environment,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{' '.join(command)} did not finish within {timeout}s:\n{output[-5000:]}")
    return subprocess.CompletedProcess(command, process.returncode, output)


forked_runs = importlib.import_module("forked_runs")  # templates/shared/tests/, on the path above


def stop_forked_runs() -> None:
    """End the forked-runs servers this process started (the next forked run starts a new one).

    For a test that runs looptpl in this process and cancels it: the cancellation waits up to 30 s
    for every child of the process to end (signals.wait_for_children), a server included.
    """
    with forked_runs.SERVERS_LOCK:
        for server in forked_runs.SERVERS.values():
            server.process.stdin.close()  # type: ignore[union-attr]  # the server ends at the end of its input
            server.process.wait(timeout=30)
        forked_runs.SERVERS.clear()


def run_forked(
    command: list[str], cwd: Path, timeout: float, env: dict[str, str], preload: tuple[str, ...], ranks: int
) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "output.log"
        processes = [
            forked_runs.start(command, log, {**env, **variables}, preload, cwd) for variables in rank_variables(ranks)
        ]
        code = forked_runs.wait_all(processes, time.monotonic() + timeout)
        if code is None:
            pytest.fail(f"{' '.join(command)} did not finish within {timeout}s:\n{log.read_text()[-5000:]}")
        return subprocess.CompletedProcess(command, code, log.read_text())


def rank_variables(ranks: int) -> list[dict[str, str]]:
    """The variables torchrun gives each of `ranks` processes on one machine (none for one process), as
    the generated torch projects' tests start their ranks (templates/torch/tests/conftest.py.jinja)."""
    if ranks == 1:
        return [{}]
    world = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(forked_runs.free_port()), "WORLD_SIZE": str(ranks)}
    world["LOCAL_WORLD_SIZE"] = str(ranks)
    return [{**world, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(ranks)]


T = TypeVar("T")


def in_parallel(*calls: Callable[[], T]) -> list[T]:
    """Call each function in a thread of its own, all at once, and return their results in order.

    For independent training runs, each a subprocess with its own timeout: a run that uses one core
    and another beside it take the time of one on a 2-core machine. A failure is raised once every
    call has returned.
    """
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
    return [future.result() for future in futures]


def answers(project: Path) -> dict:
    return yaml.safe_load((project / ".copier-answers.yml").read_text())


def python() -> str:
    return sys.executable


def train_torch(
    project: Path, run_dir: Path, *flags: str, ranks: int = 1, sources: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Train a torch project on the CPU (`ranks` gloo processes, given what torchrun gives its ranks); fails
    the test on an error.

    `sources` replaces the project's src/ (an edited copy); one thread per rank, as torchrun sets it.
    """
    package = answers(project)["package_name"]
    module = ["-m", f"{package}.train", "--run-dir", str(run_dir), "--device", "cpu", "--no-progress", *flags]
    environment = {"PYTHONPATH": str(sources or project / "src"), "OMP_NUM_THREADS": "1"}
    result = run([sys.executable, *module], cwd=project, timeout=timeout, env=environment, preload=TORCH, ranks=ranks)
    assert result.returncode == 0, result.stdout[-5000:]
    return result


def trained_weights(run_dir: Path) -> dict:
    """The model weights of a run's newest epoch checkpoint: a file, or the folder FSDP on several
    ranks writes, read here with torch's own converter (not the project's code)."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    written = [*(run_dir / "checkpoints").glob("epoch-*.pt"), *(run_dir / "checkpoints").glob("epoch-*.dcp")]
    newest = sorted(written, key=lambda path: path.stem + ".")[-1]
    if newest.suffix == ".pt":
        return torch.load(newest, weights_only=True)["model"]
    with tempfile.TemporaryDirectory() as scratch:
        dcp_to_torch_save(newest, Path(scratch) / "whole.pt")
        shards = torch.load(Path(scratch) / "whole.pt", weights_only=False)["model"]
    rest = torch.load(newest / "trainer.pt", weights_only=True)["model"]  # what was not sharded (buffers)
    return {name: shards.get(name, value) for name, value in rest.items()}


def relative_difference(left: dict, right: dict) -> float:
    """||left - right|| / ||left||, all weights as one vector: 0 for equal models, scale-free.

    Over the whole model, not per tensor: Adam turns the float noise of a gradient that is exactly
    zero in theory (an attention key bias) into steps the size of the learning rate, so one such
    tensor would differ by percent between 1 and N ranks without any bug in the loop. Takes torch
    tensors or NumPy arrays.
    """
    assert left.keys() == right.keys()
    as_float = {name: (np.asarray(left[name], np.float64), np.asarray(right[name], np.float64)) for name in left}
    difference = sum(float(((one - two) ** 2).sum()) for one, two in as_float.values())
    size = sum(float((one**2).sum()) for one, _ in as_float.values())
    return math.sqrt(difference / max(size, 1e-30))


def user_files(package: Path) -> set[str]:
    """The file names in a generated package that are the user's: copier.yml's _skip_if_exists, as rendered there."""
    listed = yaml.safe_load((REPO_ROOT / "copier.yml").read_text())["_skip_if_exists"]
    return {Path(entry).name for entry in listed if (package / Path(entry).name).is_file()}


def copy_project(example: Path, destination: Path) -> Path:
    shutil.copytree(example, destination, ignore=shutil.ignore_patterns("runs", "__pycache__", "*.egg-info"))
    return destination


def edit(project: Path, file: str, old: str, new: str) -> None:
    path = next((project / "src").glob(f"*/{file}"))
    text = path.read_text()
    assert old in text, f"{file} no longer holds {old!r}"
    path.write_text(text.replace(old, new))


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def jax_run(project: Path, run_dir: Path, *flags: str, processes: int = 0) -> list[dict]:
    """A JAX project's training run, and its epoch records (none, for a run stopped in its first epoch);
    `processes` of them started by kit/launch.py."""
    module = "kit.launch" if processes else "train"
    launch = ("--processes", str(processes), "--") if processes else ()
    command = [sys.executable, "-m", f"{project.name}.{module}", *launch, "--run-dir", str(run_dir), *flags]
    done = run(command, cwd=project, timeout=600, env={"PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-5000:]
    return records(run_dir) if (run_dir / "metrics.jsonl").exists() else []


def doc_blocks(section: str) -> dict[str, str]:
    """The ```python title="FILE" blocks of a section of docs/todos.md, by file: the code a user copies."""
    text = (REPO_ROOT / "docs" / "todos.md").read_text()
    body = text.split(f"\n### {section}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return dict(re.findall(r'```python title="([\w.]+)"\n(.*?)```', body, flags=re.DOTALL))


def write_blocks(project: Path, blocks: dict[str, str], append: tuple[str, ...] = ()) -> None:
    """Replace the project's user files with the blocks (or append to them, for those in `append`)."""
    package = project / "src" / answers(project)["package_name"]
    for name, code in blocks.items():
        path = package / name
        path.write_text((path.read_text() + "\n\n" if name in append else "") + code)


# The runs of the --steps-per-epoch, --eval-batches and no-test-set tests, torch and TensorFlow alike.
SUBSET_FLAGS = ("--epochs", "3", "--steps-per-epoch", "4", "--eval-batch-size", "16", "--eval-batches", "5")
SUBSET_FLAGS += ("--monitor-mode", "max")  # epoch 1 is the best: before the 2-rank run stops and resumes


def check_subset_runs(root: Path, code: str, in_order: str) -> None:
    """What those tests check of root/one (1 rank or replica) and root/two (2, stopped after epoch 2 and
    resumed): epochs of 4 updates; at every evaluation the same 80 val samples (`code`, a metric of their
    gathered rows), not the first 80 (`in_order` is 0); a summary without a test, with epoch 1's val figures."""
    one, two = records(root / "one"), records(root / "two")
    assert {record[code] for record in one + two} == {one[0][code]}
    assert [record["step"] for record in one] == [record["step"] for record in two] == [4, 8, 12]
    assert all(record["val_samples"] == 80 and record[in_order] == 0.0 for record in one + two)
    for run_dir in ("one", "two"):
        summary = json.loads((root / run_dir / "summary.json").read_text())
        assert summary["best_epoch"] == 1 and "tested_checkpoint" not in summary
        assert not [name for name in summary if name.startswith("test_")]
        figures = {name: value for name, value in one[0].items() if name.startswith("val_")}
        assert {name: summary[name] for name in figures} == pytest.approx(figures, rel=1e-5)


def variant_key(variant: Variant) -> str:
    """A variant's name in these tests: its strategy, or backend-strategy where an earlier backend has that
    strategy name too (jax-single)."""
    first = next(other for other in VARIANTS if other.strategy == variant.strategy)
    return variant.strategy if first is variant else f"{variant.backend}-{variant.strategy}"


# Every variant's name in these tests, in variants.py's order; and the backend of each.
KEYS = [variant_key(variant) for variant in VARIANTS]
BACKEND_OF = {variant_key(variant): variant.backend for variant in VARIANTS}


@pytest.fixture(scope="session")
def projects(tmp_path_factory) -> dict[str, Path]:
    """One rendered project per variant, named after its key (once per pytest-xdist worker that asks)."""
    root = tmp_path_factory.mktemp("projects")
    rendered = {}
    for variant in VARIANTS:
        key = variant_key(variant)
        destination = root / key.replace("-", "_")
        result = looptpl("new", str(destination), "--backend", variant.backend, "--strategy", variant.strategy)
        assert result.exit_code == 0, result.stderr
        rendered[key] = destination
    # torch does not depend on numpy, so neither may the generated loop: `train` hides it from the runs
    # (but from fsdp on several ranks: its sharded checkpoints use torch.distributed.checkpoint, which needs numpy).
    (root / "no_numpy" / "numpy").mkdir(parents=True)
    (root / "no_numpy" / "numpy" / "__init__.py").write_text(
        'raise ModuleNotFoundError("numpy is hidden from this test")\n'
    )
    return rendered


def package_of(project: Path) -> str:
    """The package of a project that `projects` rendered: named after its folder."""
    return project.name
