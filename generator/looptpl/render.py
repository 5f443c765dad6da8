"""Render the template into a new project: into a hidden folder inside DEST first, then moved into place.

DEST has been resolved once (validation.resolve_destination) and every write happens below it: the
project is rendered (and committed) in `DEST/.looptpl-XXXX/`, and only when that succeeded are its
entries moved up into DEST. A failure, Ctrl-C or SIGTERM removes what this run made, folders it created
for DEST included, so nothing half-written stays behind. Of two `looptpl new` racing into one DEST the
first to finish wins; the other stops with one line and takes its files away again.
"""

import errno
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looptpl import compiled, signals
from looptpl.errors import LooptplError
from looptpl.examples import Example, apply_example
from looptpl.gitcmd import git, identity_if_missing
from looptpl.store import installed_template
from looptpl.validation import STAGING_PREFIX, check_destination


@dataclass(frozen=True)
class RenderRequest:
    destination: Path  # absolute and resolved: the folder DEST names
    answers: Mapping[str, Any]  # every question answered: copier asks nothing
    git: bool
    dry_run: bool
    example: Example | None = None  # laid over the render before the first commit


def render_project(request: RenderRequest) -> list[str]:
    """Render the project and return its files (relative paths); with dry_run nothing is kept."""
    destination = request.destination
    check_destination(destination)  # again: the folder may have changed while the user answered
    if request.git and not request.dry_run and shutil.which("git") is None:
        raise LooptplError("git is not installed; install git or pass --no-git")
    try:
        if request.dry_run:
            with tempfile.TemporaryDirectory(prefix="looptpl-dry-run-") as scratch:
                return _render(Path(scratch), request)
        return _render_in_place(request)
    except OSError as error:
        fix = "free some space and retry" if error.errno == errno.ENOSPC else "choose another folder"
        where = f" ({error.filename})" if error.filename else ""
        reason = error.strerror or str(error).splitlines()[0]  # a failed git (copier's plumbum) has no strerror
        raise LooptplError(
            f"cannot write the project to {destination}: {reason}{where}; nothing was written, {fix}",
            exit_code=1,
        ) from None


def _render_in_place(request: RenderRequest) -> list[str]:
    destination = request.destination
    created: list[Path] = []
    moved: list[Path] = []
    staging: Path | None = None
    try:
        # A Ctrl-C between making a folder (or moving an entry) and noting it would leave it behind: the
        # signal waits for the end of these blocks, and the cleanup below knows everything they made.
        with signals.deferred():
            _make_folders(destination, created)
            staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=destination))
        files = _render(staging, request)
        staged_project = _staged_project(staging, destination)
        if request.git:
            _git_init_and_commit(staged_project)
        _claim(destination, staging)
        with signals.deferred():  # a signal meanwhile takes every entry moved so far back out
            for entry in sorted(staged_project.iterdir()):
                os.rename(entry, destination / entry.name)
                moved.append(destination / entry.name)
            signals.finished()
        moved.clear()  # every entry is in place: nothing to take back
        return files
    finally:
        signals.wait_for_children()  # after a Ctrl-C copier's git goes on, writing into the staging folder
        if staging is not None:
            _remove(staging)
        for path in moved:  # a failure half-way through the move: take this run's files away again
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for folder in reversed(created):  # after a failure DEST is empty again; on success rmdir fails, as it should
            try:
                folder.rmdir()
            except OSError:
                break  # not empty: the project, or another process's files


def _staged_project(staging: Path, destination: Path) -> Path:
    # Rendered under the final folder name: the template uses it as the default project name.
    return staging / "project" / destination.name


def _render(staging: Path, request: RenderRequest) -> list[str]:
    """Render (and lay the example over) into the staging folder; the project's files, as relative paths."""
    project = _staged_project(staging, request.destination)
    project.parent.mkdir()
    scratch = staging / "tmp"
    scratch.mkdir()
    _copier_copy(project, request.answers, scratch)
    if request.example is not None:
        apply_example(request.example, project, request.answers["package_name"])
    return sorted(str(path.relative_to(project)) for path in project.rglob("*") if path.is_file())


def _remove(folder: Path) -> None:
    """Remove a folder; retried for a moment, since a git that copier started may still be writing in it."""
    for _ in range(20):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            return
        time.sleep(0.1)


def _make_folders(destination: Path, created: list[Path]) -> None:
    """Create DEST and the folders above it that are missing; note the ones this call made, outermost first."""
    missing = [folder for folder in (destination, *destination.parents) if not folder.exists()]
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue  # made meanwhile by someone else: not ours to remove
        created.append(folder)


def _claim(destination: Path, staging: Path) -> None:
    """Make sure DEST still holds nothing but this run's staging folder (and later runs' ones) before moving in."""
    others = [entry.name for entry in destination.iterdir() if entry.name != staging.name]
    if any(not name.startswith(STAGING_PREFIX) for name in others) or any(name < staging.name for name in others):
        raise LooptplError(
            f"{destination} was filled by another process while this project was rendered (a second `looptpl new` "
            "into the same folder?); this run wrote nothing there",
            exit_code=1,
        )


def _copier_copy(destination: Path, answers: Mapping[str, Any], scratch: Path) -> None:
    copier = compiled.copier()
    from copier.errors import CopierError

    # Installed: the template's tag in the per-user store; in a checkout: its working tree.
    template = installed_template()
    # Copier clones the template into a temporary folder: make it one in the staging folder, so that its
    # cleanup removes the clone whatever stops the run (SIGTERM in the middle of the clone, say).
    previous, tempfile.tempdir = tempfile.tempdir, str(scratch)
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
    finally:
        tempfile.tempdir = previous


def _git_init_and_commit(project: Path) -> None:
    """Make the project a git repository with one commit, so `copier update` can merge later."""
    try:
        git("init", "--quiet", "--initial-branch", "main", cwd=project)
        git("add", "--all", cwd=project)
        message = "Generate project with looptpl"
        git("commit", "--quiet", "--no-verify", "-m", message, cwd=project, env=identity_if_missing(project))
    except LooptplError as error:
        raise LooptplError(f"{error}; pass --no-git to skip git", exit_code=1) from None
