"""The project's answers (`.copier-answers.yml`): read, checked, and the package folder they name."""

from pathlib import Path
from typing import Any

import yaml

from looptpl.errors import LooptplError
from looptpl.gitcmd import git
from looptpl.validation import description_problem, package_name_problem, project_name_problem
from looptpl.variants import BACKENDS, strategies

ANSWERS = ".copier-answers.yml"


def read_answers(project: Path) -> dict[str, Any]:
    """The project's `.copier-answers.yml`, or an error saying this is not a generated project."""
    if not project.is_dir():
        raise LooptplError(f"{project} is not a folder; pass the generated project's folder")
    path = project / ANSWERS
    if not path.is_file():
        raise LooptplError(f"{project} is not a looptpl project (no {ANSWERS}); pass the generated project's folder")
    try:
        answers = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        reason = getattr(error, "problem", None) or type(error).__name__
        raise LooptplError(
            f"{path} is not valid YAML ({where}{reason}); restore it with `git checkout -- {ANSWERS}`"
        ) from None
    if not isinstance(answers, dict):
        raise LooptplError(f"{path} holds no answers; restore it with `git checkout -- {ANSWERS}`")
    problem = _answers_problem(answers)
    if problem:
        raise LooptplError(f"{path}: {problem}; fix that line or restore the file with `git checkout -- {ANSWERS}`")
    return answers


def generation_commit(project: Path) -> str:
    """The commit that added the project's answers file: the project as `looptpl new` made it ('' if unknown)."""
    found = git("log", "--diff-filter=A", "--format=%H", "--", ANSWERS, cwd=project, check=False).split()
    return found[-1] if found else ""


def check_package(project: Path, answers: dict[str, Any]) -> None:
    """The package folder the answers name must exist: copier cannot follow a renamed package.

    Its old render would have the package under the recorded name, the project has it elsewhere, so
    the merge would keep the old files as "deleted by the user" and drop every template change to them.
    """
    package = answers["package_name"]
    if (project / "src" / package).is_dir():
        return
    first = generation_commit(project)
    generated = read_answers_at(project, first).get("package_name") if first else None
    if isinstance(generated, str) and generated != package and (project / "src" / generated).is_dir():
        raise LooptplError(
            f"package_name in {ANSWERS} was changed by hand from {generated} to {package}, but the code is in "
            f"src/{generated}/: an update cannot rename a package; restore the line (package_name: {generated}) with "
            f"`git checkout {first[:12]} -- {ANSWERS}`, commit, then update"
        )
    moved = sorted(path.parent.name for path in (project / "src").glob("*/train.py"))
    if moved:
        raise LooptplError(
            f"src/{package}/, the package {ANSWERS} names, is gone and src/{moved[0]}/ holds the project: an update "
            f"cannot follow a renamed package and would drop the template's changes to it; move it back (git mv "
            f"src/{moved[0]} src/{package} && git commit), then update"
        )
    raise LooptplError(
        f"src/{package}/, the package {ANSWERS} names, is missing; restore it"
        + (f" (git checkout {first[:12]} -- src/{package})" if first else "")
        + " and commit before updating"
    )


def read_answers_at(project: Path, commit: str) -> dict[str, Any]:
    """The answers file as a commit recorded it (empty if it cannot be read)."""
    prefix = git("rev-parse", "--show-prefix", cwd=project).strip()
    text = git("show", f"{commit}:{prefix}{ANSWERS}", cwd=project, check=False)
    try:
        answers = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return answers if isinstance(answers, dict) else {}


def _answers_problem(answers: dict[str, Any]) -> str | None:
    """What a hand edit broke in the answers, so that no template could render them, if anything."""
    backend, strategy = answers.get("backend"), answers.get("strategy")
    if backend not in BACKENDS:
        return f"backend {backend!r} is not one of: {', '.join(BACKENDS)}"
    if strategy not in strategies(backend):
        return f"strategy {strategy!r} is not a {backend} strategy; use one of: {', '.join(strategies(backend))}"
    for key, problem_of in (("project_name", project_name_problem), ("package_name", _recorded_package_problem)):
        value = answers.get(key)
        problem = problem_of(value) if isinstance(value, str) else f"{key} is missing or not text"
        if problem:
            return problem
    if "description" in answers:
        return description_problem(answers["description"])
    return None


def _recorded_package_problem(name: str) -> str | None:
    """What is wrong with the package name a project records. A name that only shadows what a --tracker imports
    is not refused here: such a project still updates, and renames to a name that works."""
    return package_name_problem(name, trackers=False)
