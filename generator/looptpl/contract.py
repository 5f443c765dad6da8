"""What a project's files lack of what its loop calls, as the project's own check says it.

The check lives in the generated project (src/PKG/kit/contract.py, standard library only), so train.py,
the project's tests, plain-copier users and CI run the same one; `looptpl update` runs it on the merged
project and `looptpl check` on the project as it is.
"""

import subprocess
import sys
from pathlib import Path

# Runs the check by its path, so that none of the project's modules can shadow one it imports.
RUN = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"


def unmet(project: Path, package: object) -> list[str]:
    """One line per name the loop calls that the project's files lack or define with other arguments;
    none for a project whose template predates the check (or whose answers name no package)."""
    if not isinstance(package, str) or not package.isidentifier():
        return []
    script = project / "src" / package / "kit" / "contract.py"
    if not script.is_file():
        return []
    command = [sys.executable, "-I", "-c", RUN, str(script.resolve())]  # resolved: it runs in the project
    result = subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=120, check=False)
    lines = [line.removeprefix("error: ") for line in result.stderr.splitlines() if line.startswith("error: ")]
    if result.returncode not in (0, 1) or (result.returncode == 1 and not lines):
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return [f"kit/contract.py, the check of your files, failed ({last}); restore it with `looptpl update`"]
    return lines
