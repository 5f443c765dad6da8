"""Run git and turn its failures into one-line LooptplErrors."""

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from looptpl.errors import LooptplError

# The identity of commits looptpl makes where git has none configured, so they never fail for lack of one.
FALLBACK_IDENTITY = {
    "GIT_AUTHOR_NAME": "looptpl",
    "GIT_AUTHOR_EMAIL": "looptpl@localhost",
    "GIT_COMMITTER_NAME": "looptpl",
    "GIT_COMMITTER_EMAIL": "looptpl@localhost",
}


def require_git(why: str) -> None:
    """Fail early, with the reason git is needed, when it is not installed."""
    if shutil.which("git") is None:
        raise LooptplError(f"git is not installed; {why} (install git)", exit_code=1)


def git(*args: str, cwd: Path, env: Mapping[str, str] | None = None, check: bool = True) -> str:
    """Run `git ARGS` in `cwd` and return its stdout; with check, a failure raises a LooptplError."""
    result = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **env} if env else None,
        stdin=subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        detail = lines[-1] if lines else f"exit code {result.returncode}"
        raise LooptplError(f"`git {' '.join(args)}` failed in {cwd} ({detail})", exit_code=1)
    return result.stdout


def succeeds(*args: str, cwd: Path) -> bool:
    """Whether `git ARGS` exits with 0 (for yes/no questions such as "is this a known ref?")."""
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, stdin=subprocess.DEVNULL)
    return result.returncode == 0


def identity_if_missing(cwd: Path) -> dict[str, str]:
    """FALLBACK_IDENTITY where git has no author or committer configured for `cwd`, else nothing."""
    known = all(succeeds("var", name, cwd=cwd) for name in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT"))
    return {} if known else FALLBACK_IDENTITY


def enclosing_repository(folder: Path) -> Path | None:
    """The top of the git work tree that the existing `folder` lies in, if any."""
    if shutil.which("git") is None or not succeeds("rev-parse", "--is-inside-work-tree", cwd=folder):
        return None
    return Path(git("rev-parse", "--show-toplevel", cwd=folder).strip())
