"""The finished examples in examples/ still train, stay lint clean and have no TODOs left.

Each example is a generated project a user has filled in; these are short runs, not the full
30-epoch training its README reports.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, answers, looptpl, run, user_files

DIGITS = REPO_ROOT / "examples" / "torch-digits-ddp"
TF_DIGITS = REPO_ROOT / "examples" / "tf-digits-mirrored"
EXAMPLES = [
    pytest.param(REPO_ROOT / "examples" / name, id=name)
    for name in ("torch-digits-ddp", "tf-digits-mirrored", "torch-charlm-ddp", "torch-gan-ddp", "tf-gan-mirrored")
]

needs_sklearn = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None,
    reason="examples/torch-digits-ddp loads its data from scikit-learn: pip install scikit-learn",
)
needs_tensorflow_and_sklearn = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("sklearn") is None,
    reason="examples/tf-digits-mirrored needs TensorFlow and scikit-learn: pip install tensorflow-cpu scikit-learn",
)


def train_digits(run_dir: Path, ranks: int) -> dict:
    """Two epochs of the digits example on the CPU; returns its summary.json."""
    module = ["-m", "digits_ddp.train", "--run-dir", str(run_dir), "--device", "cpu", "--no-progress"]
    flags = ["--epochs", "2", "--global-batch-size", "64", "--lr", "3e-3", "--test-on", "last"]
    launcher = [sys.executable]
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    environment = {"PYTHONPATH": str(DIGITS / "src"), "OMP_NUM_THREADS": "1"}
    result = run([*launcher, *module, *flags], cwd=DIGITS, timeout=300, env=environment)
    assert result.returncode == 0, result.stdout[-5000:]
    return json.loads((run_dir / "summary.json").read_text())


@needs_sklearn
def test_digits_example_trains_alike_on_one_and_two_ranks(tmp_path):
    one, two = train_digits(tmp_path / "one", ranks=1), train_digits(tmp_path / "two", ranks=2)
    # Two epochs reach about 0.90 test accuracy (0.10 is chance); the full 30-epoch run reaches ~0.985.
    assert one["test_accuracy"] > 0.8, one
    assert one["test_samples"] == two["test_samples"] == 270
    # The loop is exact: two ranks follow one rank up to float rounding, so at most one test image flips.
    assert abs(one["test_accuracy"] - two["test_accuracy"]) <= 1 / 270 + 1e-9, (one, two)


def train_tf_digits(run_dir: Path, replicas: int) -> dict:
    """Two epochs of the TensorFlow digits example on `replicas` logical CPU devices; returns its summary.json."""
    module = ["-m", "digits_mirrored.train", "--run-dir", str(run_dir), "--cpu-replicas", str(replicas)]
    flags = ["--epochs", "2", "--global-batch-size", "64", "--lr", "3e-3", "--test-on", "last", "--no-progress"]
    environment = {
        "PYTHONPATH": str(TF_DIGITS / "src"),
        "CUDA_VISIBLE_DEVICES": "",  # logical CPU replicas, also on a machine with GPUs
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_NUM_INTRAOP_THREADS": "1",  # 1 and 2 replicas on equal terms, as with OMP_NUM_THREADS above
    }
    result = run([sys.executable, *module, *flags], cwd=TF_DIGITS, timeout=300, env=environment)
    assert result.returncode == 0, result.stdout[-5000:]
    return json.loads((run_dir / "summary.json").read_text())


@needs_tensorflow_and_sklearn
def test_tf_digits_example_trains_alike_on_one_and_two_replicas(tmp_path):
    one, two = train_tf_digits(tmp_path / "one", replicas=1), train_tf_digits(tmp_path / "two", replicas=2)
    # Two epochs reach about 0.9 test accuracy (0.10 is chance); the full 30-epoch run reaches ~0.989.
    assert one["test_accuracy"] > 0.8, one
    assert one["test_samples"] == two["test_samples"] == 270
    # The loop is exact: two replicas follow one up to float rounding, so at most one test image flips.
    assert abs(one["test_accuracy"] - two["test_accuracy"]) <= 1 / 270 + 1e-6, (one, two)


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_has_no_todos_left(example):
    result = looptpl("todo", str(example))
    assert result.exit_code == 0, result.stdout + result.stderr


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_is_lint_clean(example):
    # Each example has its own ruff settings (its pyproject.toml); the repository's config excludes it.
    for command in (["ruff", "check", "."], ["ruff", "format", "--check", "."]):
        result = run([sys.executable, "-m", *command], cwd=example, timeout=120)
        assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs_the_current_engine(example, tmp_path):
    # An example shows today's template: its template-owned files equal a fresh render of its answers.
    # After a template change, refresh them with `looptpl update` in a copy, or copy them from a fresh render.
    recorded = answers(example)
    fresh = tmp_path / "fresh"
    questions = ("project_name", "package_name", "description")
    data = [f"--data={name}={recorded[name]}" for name in questions]
    result = looptpl(
        "new", str(fresh), "--backend", recorded["backend"], "--strategy", recorded["strategy"], "--no-git", *data
    )
    assert result.exit_code == 0, result.stderr
    package = Path("src") / recorded["package_name"]
    engine_files = [
        path
        for path in (fresh / package).iterdir()
        if path.suffix == ".py" and path.name not in user_files(fresh / package)
    ]
    stale = [path.name for path in engine_files if (example / package / path.name).read_bytes() != path.read_bytes()]
    assert not stale, f"{example.name}: engine files differ from the template: {stale}"
