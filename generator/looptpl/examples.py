"""The finished examples (examples/): find them, and start a new project from one.

An example is a generated project its authors filled in. `looptpl new DEST --example NAME` renders
the template as usual (the example's backend and strategy, the user's name), then lays the example's
own work over it: its user-owned files (copier.yml's `_skip_if_exists`), its tests, any file the
template does not make (a data folder, say) and the dependencies it added to pyproject.toml. The
package is renamed on the way. The template-managed files stay the fresh render's, so the project
starts on this looptpl's loop and `looptpl update` treats everything taken from the example as the
user's edits.
"""

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from looptpl.errors import LooptplError
from looptpl.template_source import copier_config, examples_root

ANSWERS = ".copier-answers.yml"
# Never copied from an example: what a run, an install or a tool leaves in it (the template's .gitignore).
LEFT_BEHIND = {"runs", "__pycache__", ".venv", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".git", "build", "dist"}
# What an example trains, where its answers keep the template's default description (which says nothing).
SUMMARIES = {
    "torch-digits-ddp": "A small CNN on scikit-learn's 8x8 handwritten digits",
    "tf-digits-mirrored": "A small Keras CNN on scikit-learn's 8x8 handwritten digits",
}
DEPENDENCIES = re.compile(r"^dependencies = \[(?P<items>[^\]\n]*)\]$", re.MULTILINE)


@dataclass(frozen=True)
class Example:
    """One folder of examples/ with the answers it was generated with."""

    name: str
    path: Path
    answers: dict[str, Any]

    @property
    def backend(self) -> str:
        return str(self.answers["backend"])

    @property
    def strategy(self) -> str:
        return str(self.answers["strategy"])

    @property
    def package(self) -> str:
        return str(self.answers["package_name"])

    @cached_property
    def summary(self) -> str:
        """What it trains, in one line: its description, unless that is the template's default."""
        from looptpl.questions import template_default

        description = str(self.answers.get("description", ""))
        if description and description != template_default("description"):
            return description
        return SUMMARIES.get(self.name, description)


def list_examples() -> list[Example]:
    """Every folder of examples/ that holds a generated project, by name; none if this looptpl ships none."""
    import yaml

    root = examples_root()
    if root is None:
        return []
    found = []
    for folder in sorted(root.iterdir()):
        answers_file = folder / ANSWERS
        if not answers_file.is_file():
            continue
        answers = yaml.safe_load(answers_file.read_text(encoding="utf-8"))
        if isinstance(answers, dict) and all(isinstance(answers.get(key), str) for key in ("backend", "strategy")):
            found.append(Example(folder.name, folder, answers))
    return found


def find_example(name: str) -> Example:
    """The example called `name`, or an error listing the valid names."""
    examples = list_examples()
    for example in examples:
        if example.name == name:
            return example
    choices = ", ".join(example.name for example in examples) or "none (this looptpl ships no examples)"
    raise LooptplError(f"--example {name} is not an example; choose one of: {choices} (`looptpl list` shows them)")


def apply_example(example: Example, project: Path, package: str) -> None:
    """Lay the example's work over a fresh render of its backend and strategy, renamed to `package`."""
    if not (example.path / "src" / example.package).is_dir():
        raise LooptplError(f"example {example.name} has no src/{example.package}/; reinstall looptpl", exit_code=1)
    for relative in _example_files(example):
        target = project / _renamed_path(relative, example.package, package)
        if target.exists() and not _theirs(relative, example.package):
            continue  # managed by the template: the fresh render's version is kept
        text = (example.path / relative).read_bytes()
        if relative.suffix == ".py":
            text = _rename_package(example, relative, text.decode("utf-8"), package).encode("utf-8")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text)
    _add_dependencies(example.path / "pyproject.toml", project / "pyproject.toml")


def user_file_names() -> set[str]:
    """The file names under src/<package>/ that belong to the user: copier.yml's `_skip_if_exists`."""
    return {Path(entry).name for entry in copier_config().get("_skip_if_exists", [])}


def _example_files(example: Example) -> list[Path]:
    """The example's files (relative paths), without what runs and tools leave behind."""
    files = []
    for path in sorted(example.path.rglob("*")):
        relative = path.relative_to(example.path)
        left_behind = any(part in LEFT_BEHIND or part.endswith((".egg-info", ".pyc")) for part in relative.parts)
        if path.is_file() and not left_behind and relative.name != ANSWERS:
            files.append(relative)
    return files


def _theirs(relative: Path, package: str) -> bool:
    """Whether the example's version of a file the template also makes wins: user files and tests."""
    in_package = relative.parent == Path("src", package)
    return (in_package and relative.name in user_file_names()) or relative.parts[0] == "tests"


def _renamed_path(relative: Path, old: str, new: str) -> Path:
    if relative.parts[:2] == ("src", old):
        return Path("src", new, *relative.parts[2:])
    return relative


def _rename_package(example: Example, relative: Path, text: str, new: str) -> str:
    """The example's package name replaced by the new one.

    User code imports its package (`from old.data import ...`, `import old`): those lines are
    rewritten, and any other mention of the old name is an error rather than a guess. Tests also
    name it in strings (`-m old.train`, `src / "old"`), so there every whole-word mention is renamed.
    """
    old = example.package
    if old == new:
        return text
    if relative.parts[0] == "tests":
        return re.sub(rf"\b{re.escape(old)}\b", new, text)
    imports = re.compile(rf"^(\s*(?:from|import)\s+){re.escape(old)}(?=[\s.]|$)", re.MULTILINE)
    renamed = imports.sub(rf"\g<1>{new}", text)
    for number, line in enumerate(renamed.splitlines(), start=1):
        if re.search(rf"\b{re.escape(old)}\b", line):
            raise LooptplError(
                f"example {example.name}: {relative}:{number} names its package {old!r} outside an import, so it "
                f"cannot be renamed to {new!r}; pass --name {old} to keep the example's name",
                exit_code=1,
            )
    return renamed


def _add_dependencies(example_pyproject: Path, project_pyproject: Path) -> None:
    """Add the dependencies the example's pyproject.toml lists beyond the template's (scikit-learn, say)."""
    from packaging.requirements import InvalidRequirement, Requirement

    if not example_pyproject.is_file():
        return
    theirs = DEPENDENCIES.search(example_pyproject.read_text(encoding="utf-8"))
    text = project_pyproject.read_text(encoding="utf-8")
    ours = DEPENDENCIES.search(text)
    if theirs is None or ours is None:
        raise LooptplError(
            f"cannot read the dependencies of {example_pyproject} or the new project's pyproject.toml; reinstall "
            "looptpl",
            exit_code=1,
        )
    try:
        have = {Requirement(item).name.lower() for item in _items(ours["items"])}
        added = [item for item in _items(theirs["items"]) if Requirement(item).name.lower() not in have]
    except InvalidRequirement as error:
        raise LooptplError(f"{example_pyproject}: {error}; reinstall looptpl", exit_code=1) from None
    if added:
        items = ", ".join(f'"{item}"' for item in [*_items(ours["items"]), *added])
        project_pyproject.write_text(
            text[: ours.start()] + f"dependencies = [{items}]" + text[ours.end() :], encoding="utf-8"
        )


def _items(listed: str) -> list[str]:
    return re.findall(r'"([^"]+)"', listed)
