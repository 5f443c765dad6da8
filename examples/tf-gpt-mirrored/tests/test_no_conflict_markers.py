"""An update is finished: no conflict markers are left, and no template file you edited went unseen.

`looptpl update` says which files clash, and which edited files a new template version removed; plain
`copier update` does neither. These tests name every file that still holds markers, and, until the
update is committed, every file you had edited that it removed.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Built here, so that this file does not hold them itself.
START, END = "<" * 7 + " ", ">" * 7 + " "
SKIPPED = {".git", ".venv", "venv", "runs", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "build"}
LARGEST = 1_000_000  # bytes: a larger file is data, which no merge writes markers into


def project_files() -> list[Path]:
    """The project's text-sized files, without its git data, virtual environments, caches and run directories."""
    found = []
    for folder, subfolders, files in os.walk(PROJECT_ROOT):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED and not name.endswith(".egg-info")]
        found += [Path(folder) / name for name in files if (Path(folder) / name).stat().st_size <= LARGEST]
    return found


def test_no_file_holds_conflict_markers():
    clashes = []
    for path in project_files():
        if path.suffix == ".merged":  # looptpl update's offer of a template change merged into your file: not a merge
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):  # a binary file: no merge writes markers into it
            continue
        starts = [number for number, line in enumerate(lines, start=1) if line.startswith(START)]
        if starts and any(line.startswith(END) for line in lines):
            clashes.append(f"{path.relative_to(PROJECT_ROOT)}:{starts[0]}")
        elif path.suffix == ".rej":
            clashes.append(f"{path.relative_to(PROJECT_ROOT)} (a change the update could not apply)")
    assert not clashes, (
        f"conflict markers left by an update in {', '.join(sorted(clashes))}: keep what you need of each side, "
        "delete the marker lines, and commit (apply a .rej file by hand, then delete it)"
    )


def git(*args: str) -> str | None:
    """git's output, run in the project; None where it fails (a file a commit does not hold)."""
    done = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def test_no_template_file_you_edited_was_removed_unseen():
    if shutil.which("git") is None or git("rev-parse") is None:
        pytest.skip("the project is not in a git repository")
    # The files deleted since the last commit, and the commit of the template version they came from (the
    # generation, or the last update, committed). One that was there and differs from the last commit was yours.
    deleted = (git("diff", "--name-only", "--relative", "--diff-filter=D", "HEAD") or "").split()
    base = (git("log", "-1", "--format=%H", "HEAD", "--", ".copier-answers.yml") or "").strip()
    template = {name: git("show", f"{base}:./{name}") for name in deleted} if base else {}
    edited = [name for name, text in template.items() if text is not None and text != git("show", f"HEAD:./{name}")]
    assert not edited, (
        f"the update removed {', '.join(edited)}, which you had edited: `git show HEAD:./FILE` shows your version; "
        "carry what you need to where the template's code went (git diff shows where), then commit"
    )
