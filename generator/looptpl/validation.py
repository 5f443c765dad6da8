"""Checks on names and the destination, run before anything is written.

The `*_problem` functions say what is wrong in words that fit both a flag's error message and a
question re-asked in the terminal; the `check_*` functions turn a problem into a LooptplError.
"""

import keyword
import os
import re
import sys
from pathlib import Path

from looptpl.errors import LooptplError

PROJECT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9._-]*$")
PACKAGE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
# Modules a generated project imports, or that its users import beside it.
MAJOR_MODULES = {
    "torch", "tensorflow", "keras", "jax", "flax", "numpy", "scipy", "pandas", "sklearn", "matplotlib",
    "transformers", "datasets", "tensorboard", "pytest", "conftest", "setuptools", "copier", "looptpl",
    "test", "tests",
}  # fmt: skip


def package_name_for(project_name: str) -> str:
    """The import name derived from a project name, as copier.yml derives it."""
    return project_name.lower().replace("-", "_").replace(".", "_")


def project_name_problem(name: str) -> str | None:
    if PROJECT_NAME.match(name):
        return None
    return f"{name!r} is not a valid project name: start with a letter and use only letters, digits, '.', '_' or '-'"


def package_name_problem(name: str) -> str | None:
    """A package name must import cleanly and must not hide a module the project needs."""
    if not PACKAGE_NAME.match(name):
        return (
            f"package name {name!r} is not a valid Python identifier; use lowercase letters, digits and "
            "underscores, e.g. my_project"
        )
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"package name {name!r} is a Python keyword; choose another, e.g. {name}_model"
    if name in sys.stdlib_module_names or name in MAJOR_MODULES:
        return f"package name {name!r} would shadow the module {name!r}; choose another, e.g. {name}_project"
    return None


def description_problem(description: str) -> str | None:
    """The description goes into a quoted string in pyproject.toml, so it is one line without `"` or `\\`."""
    if any(character in description for character in '"\\\n\r'):
        return "the description must be one line without double quotes or backslashes (it goes into pyproject.toml)"
    return None


def check_project_name(name: str, flag: str = "--name") -> None:
    problem = project_name_problem(name)
    if problem:
        raise LooptplError(f"{flag} {problem} (pass --name my_project)")


def check_package_name(name: str, flag: str = "--name") -> None:
    problem = package_name_problem(name)
    if problem:
        raise LooptplError(f"{flag}: {problem}")


def check_destination(destination: Path) -> None:
    """DEST must be new (or an empty folder) inside a folder we can write to."""
    if destination.exists():
        if not destination.is_dir():
            raise LooptplError(f"{destination} exists and is a file; choose a new folder for the project")
        if any(destination.iterdir()):
            raise LooptplError(f"{destination} already exists and is not empty; choose a new folder or empty it")
    parent = nearest_existing_parent(destination)
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise LooptplError(f"cannot write to {parent}; choose a destination in a folder you can write to")


def nearest_existing_parent(path: Path) -> Path:
    """The closest folder above `path` that exists (where new folders would be created)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")
