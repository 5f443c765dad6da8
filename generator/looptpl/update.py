"""Merge the installed looptpl's template into a generated project, keeping every user edit.

Copier does the merge: it renders the template version the project records (`_commit`) and the
new one, then replays the user's changes (old render -> project) onto the new render; clashing
hunks get conflict markers or `.rej` files. This module decides what "new" is, refuses what cannot
merge safely before anything is touched, runs copier, and reports the files that need attention.
Beside it: answers.py reads and checks the answers, owned.py shows what the template changed in your
files, contract.py runs the merged project's check of them, changelog.py finds the release notes.
"""

import dataclasses
import re
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from looptpl import changelog, compiled, contract, signals
from looptpl.answers import ANSWERS, check_package, generation_commit, read_answers
from looptpl.conflict import Conflict
from looptpl.errors import LooptplError
from looptpl.gitcmd import git, identity_if_missing, require_git, succeeds
from looptpl.links import refuse_links
from looptpl.moved import StrandedEdit, stranded_edits
from looptpl.owned import changed_in_template, merge_into_yours, owned_changes, owned_names, template_text
from looptpl.progress import phase
from looptpl.store import TemplateRef, has_tag, installed_template
from looptpl.variants import backend_of, strategies

REF = re.compile(r"^[\w.+/-]+$")  # what `_commit` may hold; never an option such as `--output`
MARKERS = ("<<<<<<< ", ">>>>>>> ")


class Status(Enum):
    CURRENT = "current"
    AVAILABLE = "available"
    NEWER = "newer"  # the project's template is newer than this looptpl's


@dataclass(frozen=True)
class Plan:
    project: Path
    template: TemplateRef
    current: str  # the project's template version (`_commit`)
    status: Status


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    changed: list[str] = field(default_factory=list)  # `git status` lines, e.g. "M  src/pkg/engine.py"
    conflicts: list[str] = field(default_factory=list)  # files with conflict markers, or with a `.rej` beside them
    deleted: list[str] = field(default_factory=list)  # generated files the user deleted: the update left them deleted
    generated_in: str = ""  # the commit that added the project (to restore a deleted file from)
    # The template's changes to its own version of files the user owns (kept as they are): unified diffs.
    owned_changes: list[str] = field(default_factory=list)
    strategy: str = ""  # the strategy the project switched to (--strategy), if it did
    # The user's edits to template code that the new version moved to another file or removed.
    stranded: list[StrandedEdit] = field(default_factory=list)
    # What the merged project's files lack of what its loop calls (its kit/contract.py check), one line each.
    unmet: list[str] = field(default_factory=list)
    # Beside each of your files whose template version changed: the change merged into your copy, in
    # FILE.merged, with the number of conflicts it holds ("src/pkg/model.py.merged", 0); with
    # --merge-your-files, your file itself ("src/pkg/model.py", 1).
    merged: list[tuple[str, int]] = field(default_factory=list)
    # The template's CHANGELOG.md sections after the project's version up to the new one.
    notes: list[str] = field(default_factory=list)
    # Questions new in this template version, answered with their defaults: "ci: true".
    defaulted: list[str] = field(default_factory=list)


def plan_update(project: Path, answers: dict[str, Any] | None = None) -> Plan:
    """Compare the project's template version with this looptpl's; errors name what blocks an update.
    `answers`: the project's, when the caller has read them already."""
    answers = read_answers(project) if answers is None else answers
    source, current = answers.get("_src_path"), answers.get("_commit")
    if not isinstance(source, str) or not isinstance(current, str):
        raise LooptplError(
            f"{project / ANSWERS} records no template version (_commit), so there is nothing to merge from; if you "
            "know the looptpl version X that generated it, add `_commit: vX` to it, commit, and retry"
        )
    template = installed_template()
    if not _same_folder(source, project, template.path):
        raise LooptplError(
            f"{project} follows the template at {source}, not this looptpl's ({template.url}); run `copier update` "
            "in it instead"
        )
    status = _checkout_status(template, current) if template.checkout else _store_status(template, current)
    return Plan(project, template, current, status)


def update_project(
    project: Path,
    conflict: Conflict = Conflict.inline,
    dry_run: bool = False,
    strategy: str | None = None,
    into_yours: bool = False,
) -> Outcome:
    """Update the project in place (or, with dry_run, a throwaway clone of it) and report the result; with
    `strategy`, switch the project to that strategy of its backend at the same time; with `into_yours`,
    merge the template's changes to your files into them (else beside them, as FILE.merged)."""
    answers = read_answers(project)
    changes = _strategy_change(answers, strategy)
    top = check_repository(project)
    check_no_markers(project, "update")
    plan = plan_update(project, answers)
    if plan.status is Status.NEWER:
        fix = f"check out a newer commit in {plan.template.url}" if plan.template.checkout else "pip install -U looptpl"
        raise LooptplError(
            f"{project} uses template {plan.current}, newer than this looptpl's {plan.template.label}; downgrades are "
            f"not supported: upgrade looptpl ({fix})"
        )
    if plan.status is Status.CURRENT and not changes:
        return Outcome(plan)
    check_package(project, answers)
    first = generation_commit(project)
    with tempfile.TemporaryDirectory(prefix="looptpl-renders-") as renders:
        # Before anything changes: what the project's template version made of its answers, and what
        # the new version makes of the new answers.
        with phase("Rendering the project's template version and the new one..."):
            old, new = _render(plan, answers, changes, Path(renders))
        missing = _missing_generated(project, old)  # deleted by the user before this update
        yours = owned_names(plan.template, answers["package_name"])
        # Copier writes the files the template renders, old or new, except the user's own (which it skips).
        refuse_links(project, {*_rendered(old), *_rendered(new)} - set(yours), "update")
        versions = (plan.current, plan.template.label)
        changed = changed_in_template(old, new, yours)
        owned = owned_changes(versions, old, new, changed)
        managed = [name for name in _rendered(old) if name not in yours]
        stranded = stranded_edits(project, old, new, managed)
        outcome = _merge(project, top, plan, conflict, dry_run, changes, missing, first, answers)
        merged = [] if dry_run else merge_into_yours(project, versions, old, new, changed, into_yours)
    if merged and into_yours:  # your files changed: check them again
        outcome = dataclasses.replace(outcome, unmet=contract.unmet(project, answers.get("package_name")))
    if not dry_run:  # the lines of each stranded edit in the merged file (a dry run changed no file)
        stranded = [edit.relocated(project) for edit in stranded]
    notes = changelog.between(template_text(plan.template, changelog.PATH), *versions)
    strategy = changes.get("strategy", "")
    return dataclasses.replace(
        outcome, owned_changes=owned, strategy=strategy, stranded=stranded, merged=merged, notes=notes
    )


def _merge(
    project: Path,
    top: Path,
    plan: Plan,
    conflict: Conflict,
    dry_run: bool,
    changes: dict[str, str],
    missing: list[str],
    first: str,
    answers: dict[str, Any],
) -> Outcome:
    """Run copier's merge in the project (or in a throwaway clone of it, for a dry run), then check the
    merged project's files against what its loop calls."""
    label = plan.template.label
    merging = f"Merging template {label} into {project}: rendering {plan.current} and the new template"
    if dry_run:
        with tempfile.TemporaryDirectory(prefix="looptpl-dry-run-") as scratch:
            with phase(f"Cloning {project} to try the update there..."):
                git("clone", "--quiet", "--", str(top), scratch, cwd=top)
            copy = Path(scratch) / project.resolve().relative_to(top.resolve())
            with phase(f"{merging} (in a clone)..."):
                _run_copier(copy, plan.template.ref, conflict, changes)
            return _checked(_with_deleted(_outcome(plan, copy), copy, missing, first), copy, answers)
    try:
        with phase(f"{merging}..."):
            _run_copier(project, plan.template.ref, conflict, changes)
    except BaseException:
        put_back(top)
        raise
    return _checked(_with_deleted(_outcome(plan, project), project, missing, first), project, answers)


def _checked(outcome: Outcome, merged: Path, answers: dict[str, Any]) -> Outcome:
    """The merge's outcome, with what the merged project's files lack of what its loop calls and the
    questions new in this version that the merge answered with their defaults (`answers`: the old ones)."""
    new = read_answers(merged)
    defaulted = [f"{key}: {value}" for key, value in new.items() if not key.startswith("_") and key not in answers]
    return dataclasses.replace(outcome, unmet=contract.unmet(merged, answers.get("package_name")), defaulted=defaulted)


def put_back(top: Path) -> None:
    """Undo a partial update or rename: the tree was clean before, so putting back HEAD undoes it exactly."""
    signals.wait_for_children()  # after a Ctrl-C, a git that copier started would go on changing the project
    git("reset", "--hard", "--quiet", "HEAD", cwd=top)
    git("clean", "-d", "--force", "--quiet", cwd=top)


def _strategy_change(answers: dict[str, Any], strategy: str | None) -> dict[str, str]:
    """The answer to change for `--strategy` (none if it is the project's already), or an error for another
    backend's strategy or an unknown one."""
    backend = answers["backend"]
    if strategy is None or strategy == answers["strategy"]:
        return {}
    if strategy not in strategies(backend):
        other = backend_of(strategy)
        if other is None:
            raise LooptplError(
                f"--strategy {strategy} is not a strategy; choose one of: {', '.join(strategies(backend))}"
            )
        raise LooptplError(
            f"--strategy {strategy} is a {other} strategy and this project is {backend} code: a backend switch "
            f"rewrites every file you own, which an update never does; start a new project (looptpl new DEST "
            f"--strategy {strategy}) and move your model, data and step over"
        )
    return {"strategy": strategy}


def _render(plan: Plan, answers: dict[str, Any], changes: dict[str, str], scratch: Path) -> tuple[Path, Path]:
    """The template at the project's version with its answers (what copier merges from), and at the new
    version with the new answers, rendered under `scratch`."""
    copier = compiled.copier()

    data = {key: value for key, value in answers.items() if not key.startswith("_")}
    sides = (scratch / "old", plan.current, data), (scratch / "new", plan.template.ref, {**data, **changes})
    with copier_failures("rendered"):
        for folder, ref, values in sides:
            copier.run_copy(str(plan.template.path), folder, data=values, vcs_ref=ref, defaults=True, quiet=True)
    return scratch / "old", scratch / "new"


def _rendered(render: Path) -> list[str]:
    """Every file of a render, as paths in the project."""
    return [path.relative_to(render).as_posix() for path in render.rglob("*") if path.is_file()]


def _missing_generated(project: Path, old: Path) -> list[str]:
    """The files the project's template version makes of its answers that the project no longer has: the
    user deleted them (files of a strategy the project left, or of a version before, are not among them)."""
    return sorted(path for path in _rendered(old) if not (project / path).exists())


def _with_deleted(outcome: Outcome, project: Path, missing: list[str], first: str) -> Outcome:
    """The outcome with the generated files the user had deleted and the update left deleted: copier keeps a
    deletion as the user's edit, so the template's fixes to those files were not applied."""
    deleted = sorted(path for path in missing if not (project / path).exists())
    return Outcome(outcome.plan, outcome.changed, outcome.conflicts, deleted, first)


def _same_folder(source: str, project: Path, folder: Path) -> bool:
    path = Path(source).expanduser()
    return (path if path.is_absolute() else project / path).resolve() == folder.resolve()


def _store_status(template: TemplateRef, current: str) -> Status:
    new, old = Version(template.ref), _version(current)
    if old is None:
        raise LooptplError(
            f"template version {current!r} is not a looptpl release tag; update this project with `copier update` "
            "from the template it was generated from"
        )
    if old > new:
        return Status.NEWER
    if not has_tag(template.path, current):
        raise LooptplError(
            f"template {current} is not in the template store {template.path}: install looptpl=={old} once (e.g. in "
            "a throwaway venv) and run its `looptpl check` to store it, then retry"
        )
    return Status.CURRENT if old == new else Status.AVAILABLE


def _checkout_status(template: TemplateRef, current: str) -> Status:
    root = template.path
    if not REF.match(current) or not succeeds("rev-parse", "--verify", "--quiet", f"{current}^{{commit}}", cwd=root):
        raise LooptplError(
            f"template version {current!r} is not a commit of the checkout {root}; fetch it (git fetch --tags) or "
            "check out the commit the project was generated from"
        )
    old = git("rev-parse", f"{current}^{{commit}}", cwd=root).strip()
    if old == git("rev-parse", "HEAD", cwd=root).strip():
        return Status.CURRENT
    return Status.AVAILABLE if succeeds("merge-base", "--is-ancestor", old, "HEAD", cwd=root) else Status.NEWER


def _version(tag: str) -> Version | None:
    try:
        return Version(tag)  # PEP 440 allows the leading "v" of our tags
    except InvalidVersion:
        return None


def check_repository(project: Path) -> Path:
    """The top of the project's git repository, which must have a commit and no uncommitted changes."""
    require_git("updates merge through git")
    top = git("rev-parse", "--show-toplevel", cwd=project, check=False).strip()
    if not top:
        raise LooptplError(
            f"{project} is not a git repository; run `git init && git add --all && git commit -m Generate` in it "
            "first, so the update can be reviewed and undone"
        )
    if not succeeds("rev-parse", "--verify", "--quiet", "HEAD", cwd=project):
        raise LooptplError(f"{project} has no commit yet; commit the generated files first (git add -A && git commit)")
    dirty = [line[3:] for line in git("status", "--porcelain", cwd=project).splitlines()]
    if dirty:
        shown = ", ".join(dirty[:3]) + (f" and {len(dirty) - 3} more" if len(dirty) > 3 else "")
        raise LooptplError(
            f"{project} has uncommitted changes ({shown}); commit or stash them first, so the update can be reviewed "
            "and undone"
        )
    return Path(top)


def _run_copier(project: Path, ref: str, conflict: Conflict, changes: dict[str, str]) -> None:
    copier = compiled.copier()
    from plumbum import local  # copier runs git through plumbum, whose environment is set here

    # Copier commits in scratch repositories; give git an identity where none is configured.
    with copier_failures("merged"), local.env(**identity_if_missing(project)):
        copier.run_update(
            project,
            vcs_ref=ref,
            data=changes,
            defaults=True,
            overwrite=True,
            skip_answered=True,
            conflict=conflict.value,
            quiet=True,
        )


@contextmanager
def copier_failures(action: str) -> Iterator[None]:
    """Copier's warnings hidden, and its failure or a Ctrl-C/SIGTERM as one line saying nothing was changed."""
    from copier.errors import CopierError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. a dirty development checkout; expected there
            yield
    except CopierError as error:
        raise LooptplError(f"the template could not be {action} ({error}); nothing was changed", exit_code=1) from None
    except (signals.Cancelled, KeyboardInterrupt):  # Ctrl-C or SIGTERM
        raise LooptplError("cancelled; the project was left as it was", exit_code=signals.exit_code) from None


def _outcome(plan: Plan, project: Path) -> Outcome:
    """What changed in the project, and which files hold conflicts (markers, unmerged, or a `.rej`)."""
    status = git("status", "--porcelain", "-z", "--untracked-files=all", "--", ".", cwd=project)
    prefix = git("rev-parse", "--show-prefix", cwd=project).strip()
    entries = iter(status.split("\0"))
    changed: list[str] = []
    conflicts: set[str] = set()
    for entry in entries:
        if not entry:
            continue
        code, path = entry[:2], entry[3:].removeprefix(prefix)
        if code[0] in "RC":
            next(entries, None)  # the original path of a rename or copy
        changed.append(f"{code.strip():<2} {path}")
        if path.endswith(".rej"):
            conflicts.add(path.removesuffix(".rej"))
        elif "U" in code or ("D" not in code and _has_markers(project / path)):
            conflicts.add(path)
    return Outcome(plan, changed, sorted(conflicts))


def files_with_markers(project: Path) -> list[str]:
    """The project's files (tracked, or new and not ignored) that hold conflict markers or have a `.rej` file
    beside them: an unfinished merge."""
    listed = git("ls-files", "-co", "--exclude-standard", "-z", cwd=project, check=False).split("\0")
    rejected = {name.removesuffix(".rej") for name in listed if name.endswith(".rej")}
    return sorted(rejected | {name for name in listed if name and _has_markers(project / name)})


def check_no_markers(project: Path, command: str) -> None:
    """Refuse to merge into files that still hold an earlier update's conflict markers (or `.rej` files): the new
    merge would nest its markers inside the old ones."""
    unfinished = files_with_markers(project)
    if unfinished:
        shown = ", ".join(unfinished[:3]) + (f" and {len(unfinished) - 3} more" if len(unfinished) > 3 else "")
        raise LooptplError(
            f"{project} still holds an earlier update's conflict markers or .rej file ({shown}); resolve them (keep "
            "what you need of each side and delete the marker lines, or apply the .rej by hand and delete it), "
            f"commit, then {command}"
        )


def _has_markers(path: Path) -> bool:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    return any(line.startswith(MARKERS[0]) for line in lines) and any(line.startswith(MARKERS[1]) for line in lines)
