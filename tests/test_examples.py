"""The finished examples in examples/ still train, stay lint clean and have no TODOs left.

Each example is a generated project a user has filled in; these are short runs, not the full
30-epoch training its README reports.
"""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, TENSORFLOW, TORCH, answers, in_parallel, looptpl, run, user_files

DIGITS = REPO_ROOT / "examples" / "torch-digits-ddp"
TF_DIGITS = REPO_ROOT / "examples" / "tf-digits-mirrored"
TF_CHARLM = REPO_ROOT / "examples" / "tf-charlm-mirrored"
GPT = REPO_ROOT / "examples" / "torch-gpt-ddp"
TF_GPT = REPO_ROOT / "examples" / "tf-gpt-mirrored"
JAX_DIGITS = REPO_ROOT / "examples" / "jax-digits-data-parallel"
JAX_CHARLM = REPO_ROOT / "examples" / "jax-charlm-data-parallel"
EXAMPLES = [
    pytest.param(REPO_ROOT / "examples" / name, id=name)
    for name in (
        "torch-digits-ddp",
        "tf-digits-mirrored",
        "torch-charlm-ddp",
        "torch-gan-ddp",
        "tf-gan-mirrored",
        "tf-charlm-mirrored",
        "torch-gpt-ddp",
        "tf-gpt-mirrored",
        "jax-digits-data-parallel",
        "jax-charlm-data-parallel",
    )
]

needs_sklearn = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None,
    reason="examples/torch-digits-ddp loads its data from scikit-learn: pip install scikit-learn",
)
needs_tensorflow = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="examples/tf-charlm-mirrored needs TensorFlow: pip install tensorflow-cpu",
)
needs_tensorflow_and_sklearn = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("sklearn") is None,
    reason="examples/tf-digits-mirrored needs TensorFlow and scikit-learn: pip install tensorflow-cpu scikit-learn",
)


def train_digits(run_dir: Path, ranks: int) -> dict:
    """Two epochs of the digits example on the CPU; returns its summary.json."""
    module = ["-m", "digits_ddp.train", "--run-dir", str(run_dir), "--device", "cpu", "--no-progress"]
    flags = ["--epochs", "2", "--global-batch-size", "64", "--lr", "3e-3", "--test-on", "last"]
    environment = {"PYTHONPATH": str(DIGITS / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, *module, *flags]
    result = run(command, cwd=DIGITS, timeout=300, env=environment, preload=TORCH, ranks=ranks)
    assert result.returncode == 0, result.stdout[-5000:]
    return json.loads((run_dir / "summary.json").read_text())


@needs_sklearn
def test_digits_example_trains_alike_on_one_and_two_ranks(tmp_path):
    one, two = in_parallel(
        lambda: train_digits(tmp_path / "one", ranks=1),
        lambda: train_digits(tmp_path / "two", ranks=2),
    )
    # Two epochs reach about 0.90 test accuracy (0.10 is chance); the full 30-epoch run reaches ~0.985.
    assert one["test_accuracy"] > 0.8, one
    assert one["test_samples"] == two["test_samples"] == 270
    # The loop is exact: two ranks follow one rank up to float rounding, so at most one test image flips.
    assert abs(one["test_accuracy"] - two["test_accuracy"]) <= 1 / 270 + 1e-9, (one, two)


def train_tf_example(example: Path, run_dir: Path, replicas: int, *flags: str) -> dict:
    """A TensorFlow example trained on `replicas` logical CPU devices; returns its summary.json."""
    package = answers(example)["package_name"]
    module = ["-m", f"{package}.train", "--run-dir", str(run_dir), "--cpu-replicas", str(replicas), "--no-progress"]
    environment = {
        "PYTHONPATH": str(example / "src"),
        "CUDA_VISIBLE_DEVICES": "",  # logical CPU replicas, also on a machine with GPUs
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_NUM_INTRAOP_THREADS": "1",  # 1 and 2 replicas on equal terms, as with OMP_NUM_THREADS above
    }
    result = run([sys.executable, *module, *flags], cwd=example, timeout=300, env=environment, preload=TENSORFLOW)
    assert result.returncode == 0, result.stdout[-5000:]
    return json.loads((run_dir / "summary.json").read_text())


@needs_tensorflow_and_sklearn
def test_tf_digits_example_trains_alike_on_one_and_two_replicas(tmp_path):
    flags = ("--epochs", "2", "--global-batch-size", "64", "--lr", "3e-3", "--test-on", "last")
    one, two = in_parallel(
        lambda: train_tf_example(TF_DIGITS, tmp_path / "one", 1, *flags),
        lambda: train_tf_example(TF_DIGITS, tmp_path / "two", 2, *flags),
    )
    # Two epochs reach about 0.9 test accuracy (0.10 is chance); the full 30-epoch run reaches ~0.989.
    assert one["test_accuracy"] > 0.8, one
    assert one["test_samples"] == two["test_samples"] == 270
    # The loop is exact: two replicas follow one up to float rounding, so at most one test image flips.
    assert abs(one["test_accuracy"] - two["test_accuracy"]) <= 1 / 270 + 1e-6, (one, two)


@needs_tensorflow
def test_tf_charlm_example_is_exact_over_replicas_and_micro_steps(tmp_path):
    # 256 functions of 48-256 bytes, padded per replica batch: 2 replicas x 2 micro-steps give the
    # update of 1 replica only if every real token of the global batch weighs the same. Dropout is
    # off here: 1 and 2 replicas would draw different masks.
    flags = (
        "--epochs",
        "1",
        "--train-functions",
        "256",
        "--eval-functions",
        "64",
        "--dropout",
        "0",
        "--warmup-steps",
        "0",
    )
    one, two = in_parallel(
        lambda: train_tf_example(TF_CHARLM, tmp_path / "one", 1, *flags),
        lambda: train_tf_example(TF_CHARLM, tmp_path / "two", 2, *flags, "--grad-accum-steps", "2"),
    )
    assert one["test_tokens"] == two["test_tokens"] > 64 * 47  # every real token of the split, counted once
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=1e-5)
    assert one["test_perplexity"] < 60, one  # 257 is chance; 8 updates already learn the common bytes


def train_jax_example(example: Path, run_dir: Path, *flags: str) -> dict:
    """A JAX example trained on the CPU devices its flags ask for; returns its summary.json."""
    package = answers(example)["package_name"]
    command = [sys.executable, "-m", f"{package}.train", "--run-dir", str(run_dir), "--no-progress", *flags]
    environment = {"PYTHONPATH": str(example / "src"), "OMP_NUM_THREADS": "1"}
    result = run(command, cwd=example, timeout=300, env=environment)
    assert result.returncode == 0, result.stdout[-5000:]
    return json.loads((run_dir / "summary.json").read_text())


@needs_sklearn
def test_jax_digits_example_trains_alike_on_one_and_two_devices(tmp_path):
    flags = ("--epochs", "2", "--global-batch-size", "64", "--lr", "3e-3", "--test-on", "last")
    one, two = in_parallel(
        lambda: train_jax_example(JAX_DIGITS, tmp_path / "one", "--cpu-devices", "1", *flags),
        lambda: train_jax_example(JAX_DIGITS, tmp_path / "two", "--cpu-devices", "2", *flags),
    )
    # Two epochs reach about 0.9 test accuracy (0.10 is chance); the full 30-epoch run reaches ~0.99.
    assert one["test_accuracy"] > 0.8, one
    assert one["test_samples"] == two["test_samples"] == 270
    # The loop is exact: two devices follow one up to float rounding, so at most one test image flips.
    assert abs(one["test_accuracy"] - two["test_accuracy"]) <= 1 / 270 + 1e-6, (one, two)
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=1e-4)


def test_jax_charlm_example_is_exact_over_devices_and_micro_steps(tmp_path):
    # 256 functions of 48-256 bytes padded to 256: 2 devices x 2 micro-steps give the update of 1 device only
    # if every real token of the global batch weighs the same. Dropout stays on: each function draws its own
    # masks, the same on any number of devices.
    flags = ("--epochs", "1", "--train-functions", "256", "--eval-functions", "64", "--warmup-steps", "0")
    one, two = in_parallel(
        lambda: train_jax_example(JAX_CHARLM, tmp_path / "one", "--cpu-devices", "1", *flags),
        lambda: train_jax_example(
            JAX_CHARLM, tmp_path / "two", "--cpu-devices", "2", "--grad-accum-steps", "2", *flags
        ),
    )
    assert one["test_tokens"] == two["test_tokens"] > 64 * 47  # every real token of the split, counted once
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=1e-5)
    assert one["test_perplexity"] < 60, one  # 256 is chance; 8 updates already learn the common bytes


def test_gpt_example_passes_its_own_tests_within_its_test_budget(tmp_path):
    """The project's own tests, as generated, on a large corpus written by prepare_data and without a test set:
    settings.py's TEST_DEFAULTS (8 updates an epoch, 2 evaluation batches) keep each run to seconds.
    Two of them here, one on those epochs and one on the 16-update epochs of the tests that count updates;
    the whole suite passes too (about 4 minutes on 2 cores)."""
    project = tmp_path / "gpt"
    shutil.copytree(GPT, project, ignore=shutil.ignore_patterns("data", "runs", "__pycache__"))
    tests = [
        "tests/test_resume.py::test_resume_gives_the_same_result_as_an_uninterrupted_run",
        "tests/test_hooks.py::test_hooks_run_in_order_add_values_and_keep_their_state_over_a_resume",
    ]
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=project, timeout=600)
    assert result.returncode == 0 and "2 passed" in result.stdout, result.stdout[-5000:]


@needs_tensorflow
def test_tf_gpt_example_passes_its_own_tests_within_its_test_budget(tmp_path):
    """The project's own tests, as generated, on token windows and without a test set: settings.py's
    TEST_DEFAULTS (8 updates an epoch, 2 evaluation batches, a 200 kB corpus, no dropout) keep each run to
    seconds. One of them here, the run every other test compares with (a TensorFlow transformer's tracing
    makes each run cost 15-20 s of a CPU); the whole suite passes too (about 3 minutes on 2 cores)."""
    project = tmp_path / "gpt"
    shutil.copytree(TF_GPT, project, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    test = "tests/test_training.py::test_trains_and_writes_the_run_directory"
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=project, timeout=600)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-5000:]


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_answers_carry_no_path_of_the_machine_that_made_it(example):
    recorded = answers(REPO_ROOT / "examples" / example)
    version = looptpl("--version").stdout.split()[-1]
    assert recorded["_src_path"] == "../.." and recorded["_commit"] == f"v{version}"


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
    yours = user_files(fresh / package)
    engine_files = [
        path.relative_to(fresh / package)
        for path in (fresh / package).rglob("*.py")
        if path.parent != fresh / package or path.name not in yours
    ]
    stale = [
        str(name)
        for name in engine_files
        if not (example / package / name).is_file()
        or (example / package / name).read_bytes() != (fresh / package / name).read_bytes()
    ]
    assert not stale, f"{example.name}: engine files differ from the template: {stale}"
    # A template file the template no longer makes is gone from the example too.
    kept = {Path(name) for name in engine_files} | {Path(name) for name in yours}
    left = [str(path.relative_to(example / package)) for path in (example / package).rglob("*.py")]
    assert not [name for name in left if Path(name) not in kept], f"{example.name}: files the template no longer makes"
