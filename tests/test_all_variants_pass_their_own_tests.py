"""Every variant's project passes its own test suite, as its user runs it with `pytest`.

The longest part of this suite, so it goes first: pytest-xdist (`--dist loadscope`, in collection order,
see pyproject.toml) hands each class to one worker, and here each variant has a class of its own, the
longest suites first, so the two workers start on them and the shorter modules fill in after.
"""

import re
import sys
from pathlib import Path

import pytest
from conftest import BACKEND_OF, KEYS, package_of, run

# Each backend's variant whose project's suite runs whole; the others run what differs from it.
REFERENCE = {"torch": "single", "tensorflow": "one-device", "jax": "jax-single"}


def reference_of(projects: dict[str, Path], strategy: str) -> Path:
    return projects[REFERENCE[BACKEND_OF[strategy]]]


def reads_alike(project: Path, reference: Path, name: str) -> bool:
    """Whether tests/NAME reads the same in both projects, package names aside."""
    ours, theirs = project / "tests" / name, reference / "tests" / name
    if not theirs.exists():
        return False
    words = re.compile(rf"\b({package_of(project)}|{package_of(reference)})\b")
    return words.sub("PKG", ours.read_text()) == words.sub("PKG", theirs.read_text())


def helpers_read_alike(projects: dict[str, Path], strategy: str) -> bool:
    """Whether the test helpers the reference has (conftest.py, and project.py but in JAX's) read alike."""
    project, reference = projects[strategy], reference_of(projects, strategy)
    helpers = [name for name in ("conftest.py", "project.py") if (reference / "tests" / name).exists()]
    return all(reads_alike(project, reference, helper) for helper in helpers)


def suite_files(projects: dict[str, Path], strategy: str) -> list[str]:
    """The test files of a variant's suite that this suite runs.

    All of them for each backend's reference variant. For the others, a test file that reads the
    same as the reference's, package name aside, with the same helpers (conftest.py, project.py), runs
    one process against the same engine code as there: only the files that differ run (the
    distributed tests, say), and every file a user gets still runs in one variant of its backend.
    """
    project, reference = projects[strategy], reference_of(projects, strategy)
    files = sorted(path.name for path in (project / "tests").glob("test_*.py"))
    if project == reference or not helpers_read_alike(projects, strategy):
        return files
    return [name for name in files if not reads_alike(project, reference, name)]


def passes_its_own_tests(projects: dict[str, Path], strategy: str) -> None:
    files = [f"tests/{name}" for name in suite_files(projects, strategy)]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    result = run(command, cwd=projects[strategy], timeout=1200)
    assert result.returncode == 0, result.stdout[-8000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


# The variants, long suites first (minutes on 2 busy cores: multi-worker 11-13, one-device 8-10, ddp and fsdp
# 6-7, single and mirrored 4): a class each, which pytest-xdist's loadscope hands to a worker of its own. Each
# worker starts with two classes: one takes one-device then multi-worker, the other ddp then fsdp, so the two
# TensorFlow suites that start the most processes at once do not run side by side.
SUITE_ORDER = (
    *("one-device", "ddp", "multi-worker", "fsdp", "single", "mirrored"),
    *("data-parallel", "jax-fsdp", "jax-single"),
)


def suite_test(strategy: str) -> type:
    """A test class whose one test runs `strategy`'s suite."""

    @pytest.mark.slow
    def test_generated_project_passes_its_own_tests(self, projects):
        passes_its_own_tests(projects, strategy)

    name = "Test" + "".join(part.title() for part in strategy.split("-")) + "Project"
    return type(name, (), {"test_generated_project_passes_its_own_tests": test_generated_project_passes_its_own_tests})


for _strategy in SUITE_ORDER:
    _suite = suite_test(_strategy)
    globals()[_suite.__name__] = _suite


def test_every_variant_shares_its_backends_test_helpers_so_only_what_differs_runs_twice(projects):
    """A conftest.py or project.py that differs from the reference variant's (one docstring is enough) makes
    the variant's whole suite run here again: about ten minutes of CI for nothing a user would see."""
    for strategy in projects:
        if strategy not in REFERENCE.values():
            assert helpers_read_alike(projects, strategy), f"{strategy}'s tests/conftest.py or project.py differ"


def test_every_variant_has_a_suite_class():
    """A variant missing from SUITE_ORDER would have its project's suite run nowhere."""
    assert sorted(SUITE_ORDER) == sorted(KEYS)
