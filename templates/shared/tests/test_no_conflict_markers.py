"""No conflict markers are left in the project: an update that clashed with your edits is finished.

`looptpl update` says which files clash; plain `copier update` leaves its markers without a word.
This test names every file that still holds them.
"""

import os
from pathlib import Path

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
