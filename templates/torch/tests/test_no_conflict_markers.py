"""No conflict markers are left in the project: an update that clashed with your edits is finished.

`looptpl update` says which files clash; plain `copier update` leaves its markers without a word.
This test names every file that still holds them.
"""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Built here, so that this file does not hold them itself.
MARKERS = ("<" * 7 + " ", ">" * 7 + " ")
SKIPPED = {".git", ".venv", "venv", "runs", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "build"}


def project_files() -> list[Path]:
    """The project's files, without its git data, virtual environments, caches and run directories."""
    found = []
    for path in PROJECT_ROOT.rglob("*"):
        parts = set(path.relative_to(PROJECT_ROOT).parts)
        if path.is_file() and not parts & SKIPPED and not any(part.endswith(".egg-info") for part in parts):
            found.append(path)
    return found


def test_no_file_holds_conflict_markers():
    clashes = []
    for path in project_files():
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):  # a binary file: no merge writes markers into it
            continue
        for number, line in enumerate(lines, start=1):
            if line.startswith(MARKERS):
                clashes.append(f"{path.relative_to(PROJECT_ROOT)}:{number}")
                break
    assert not clashes, (
        f"conflict markers left by an update in {', '.join(clashes)}: keep what you need of each side, "
        "delete the marker lines, and commit"
    )
