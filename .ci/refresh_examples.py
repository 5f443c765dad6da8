"""Re-render every example in examples/ from the current template, keeping its user files.

Maintainers run it after a template change: `python .ci/refresh_examples.py`. Template-managed
files are replaced by a fresh render with the example's answers; user files (copier.yml's
_skip_if_exists) stay as the example wrote them, and ones the example lacks (a user file the
template added since) come from the render. Its answers file names the template by where it is in a
clone of this repository (../..) and by the release the example ships with, never by a path of the
machine that refreshed it.
"""

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
KEEP = {"README.md", ".copier-answers.yml", "pyproject.toml"}  # the example's own text, answers and dependencies


def refresh(example: Path) -> None:
    answers = yaml.safe_load((example / ".copier-answers.yml").read_text())
    user = {Path(entry).name for entry in yaml.safe_load((REPO / "copier.yml").read_text())["_skip_if_exists"]}
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch) / example.name
        data = [f"--data={key}={value}" for key, value in answers.items() if not key.startswith("_")]
        subprocess.run(
            [sys.executable, "-m", "copier", "copy", "--trust", "--defaults", *data, str(REPO), str(fresh)],
            check=True,
            capture_output=True,
        )
        for path in sorted(fresh.rglob("*")):
            relative = path.relative_to(fresh)
            target = example / relative
            if path.is_dir() or relative.parts[0] == ".git" or str(relative) in KEEP:
                continue
            if path.name in user and target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    write_answers(example, answers)
    print(f"refreshed {example.relative_to(REPO)}")


def write_answers(example: Path, answers: dict[str, object]) -> None:
    """The example's answers, with the template as a clone of this repository has it."""
    version = re.search(r'__version__ = "(.+)"', (REPO / "generator" / "looptpl" / "__init__.py").read_text())
    assert version is not None
    portable = {**answers, "_commit": f"v{version.group(1)}", "_src_path": "../.."}
    header = "# Changes here will be overwritten by Copier; NEVER EDIT MANUALLY\n"
    (example / ".copier-answers.yml").write_text(header + yaml.safe_dump(portable, sort_keys=True))


if __name__ == "__main__":
    for example in sorted((REPO / "examples").iterdir()):
        if (example / ".copier-answers.yml").is_file():
            refresh(example)
