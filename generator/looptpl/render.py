"""Render the template into a new project: into a temporary folder first, then moved into place.

Nothing appears at DEST unless rendering (and `git init`) succeeded, so a failure leaves no
half-written project behind.
"""

import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looptpl.errors import LooptplError
from looptpl.examples import Example, apply_example
from looptpl.gitcmd import git, identity_if_missing
from looptpl.store import installed_template
from looptpl.validation import check_destination, nearest_existing_parent


@dataclass(frozen=True)
class RenderRequest:
    destination: Path
    answers: Mapping[str, Any]  # every question answered: copier asks nothing
    git: bool
    dry_run: bool
    example: Example | None = None  # laid over the render before the first commit


def render_project(request: RenderRequest) -> list[str]:
    """Render the project and return its files (relative paths); with dry_run nothing is kept."""
    check_destination(request.destination)  # again: the folder may have changed while the user answered
    if request.git and not request.dry_run and shutil.which("git") is None:
        raise LooptplError("git is not installed; install git or pass --no-git")
    parent = nearest_existing_parent(request.destination)
    try:
        staging = Path(tempfile.mkdtemp(prefix=".looptpl-", dir=parent))
    except OSError as error:
        raise LooptplError(f"cannot write to {parent} ({error.strerror}); choose a folder you can write to") from None
    try:
        # Render under the final folder name: the template uses it as the default project name.
        staged_project = staging / request.destination.name
        _copier_copy(staged_project, request.answers)
        if request.example is not None:
            apply_example(request.example, staged_project, request.answers["package_name"])
        files = sorted(str(path.relative_to(staged_project)) for path in staged_project.rglob("*") if path.is_file())
        if request.dry_run:
            return files
        if request.git:
            _git_init_and_commit(staged_project)
        request.destination.parent.mkdir(parents=True, exist_ok=True)
        if request.destination.is_dir():
            request.destination.rmdir()  # empty, checked above
        os.replace(staged_project, request.destination)
        return files
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copier_copy(destination: Path, answers: Mapping[str, Any]) -> None:
    import copier  # imported here: it is slow to import and `looptpl --help` does not need it
    from copier.errors import CopierError

    # Installed: the template's tag in the per-user store; in a checkout: its working tree.
    template = installed_template()
    try:
        with warnings.catch_warnings():
            # Copier warns when a development checkout has uncommitted changes; that is expected there.
            warnings.simplefilter("ignore")
            copier.run_copy(
                template.url,
                destination,
                data=dict(answers),
                defaults=True,
                vcs_ref=template.ref,
                quiet=True,
                cleanup_on_error=True,
            )
    except CopierError as error:
        raise LooptplError(f"the template could not be rendered: {error}", exit_code=1) from None
    except KeyboardInterrupt:
        raise LooptplError("cancelled; nothing was written", exit_code=130) from None


def _git_init_and_commit(project: Path) -> None:
    """Make the project a git repository with one commit, so `copier update` can merge later."""
    try:
        git("init", "--quiet", "--initial-branch", "main", cwd=project)
        git("add", "--all", cwd=project)
        message = "Generate project with looptpl"
        git("commit", "--quiet", "--no-verify", "-m", message, cwd=project, env=identity_if_missing(project))
    except LooptplError as error:
        raise LooptplError(f"{error}; pass --no-git to skip git", exit_code=1) from None
