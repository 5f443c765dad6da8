"""Checks on names and the destination, run before anything is written.

The `*_problem` functions say what is wrong in words that fit both a flag's error message and a
question re-asked in the terminal; the `check_*` functions turn a problem into a LooptplError.
"""

import keyword
import os
import re
import sys
import unicodedata
from pathlib import Path

from looptpl import template_source
from looptpl.errors import LooptplError

# A PEP 508 distribution name (pyproject.toml's `name`) that starts with a letter: it ends with a letter or digit.
PROJECT_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
PACKAGE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
NAME_MAX, PATH_MAX = 255, 3800  # bytes: a file name, and DEST with room for the project's own paths below it
STAGING_PREFIX = ".looptpl-"  # the hidden folder inside DEST where `looptpl new` renders before moving in
MAX_NAME = 100  # characters of a project or package name: a file name, a distribution name, a line in a README
# Modules a generated project imports, that its users import beside it, or that the frameworks import: a
# package of that name under src/ would be imported in their place. The frameworks' lists are what torch,
# tensorflow and jax install (tests/test_cli.py checks them against the installed distributions); the last line holds
# the names copier.yml refuses for the same reason (the project's own modules, which tests import by name).
MAJOR_MODULES = {
    "torch", "tensorflow", "keras", "jax", "flax", "numpy", "scipy", "pandas", "sklearn", "matplotlib",
    "transformers", "datasets", "tensorboard", "pytest", "conftest", "setuptools", "copier", "looptpl",
    "test", "tests", "pkg_resources", "wheel", "pip", "yaml", "mpl_toolkits", "pylab",
    "filelock", "fsspec", "functorch", "isympy", "jinja2", "markupsafe", "mpmath", "networkx", "sympy", "torchgen",
    "typing_extensions", "triton",
    "absl", "astunparse", "certifi", "charset_normalizer", "clang", "flatbuffers", "gast", "google", "grpc", "h5py",
    "idna", "markdown_it", "mdurl", "ml_dtypes", "namex", "opt_einsum", "optree", "packaging", "pasta",
    "pygments", "requests", "rich", "six", "termcolor", "urllib3", "wrapt", "tensorflow_io_gcs_filesystem",
    "pluggy", "iniconfig", "py",
    "jaxlib", "optax", "orbax", "etils", "tensorstore", "treescope", "msgpack", "humanize", "aiofiles",
    "prometheus_client", "psutil", "simplejson", "uvloop", "flaxlib_src",
    "data", "model", "train", "config",
}  # fmt: skip
# What a run with --tracker wandb or --tracker mlflow imports beyond those: the tracker's package and the modules
# it loads as it opens, logs and closes a run (MLflow on its default SQLite store). Measured offline with wandb 0.31
# and mlflow-skinny 3.18 (the test extra caps them there); tests/test_cli.py opens each tracker and checks every
# module it loads is refused. A package of one of these names and the installed module are one name on sys.path:
# the run cannot import both.
TRACKER_MODULES = {
    "wandb": {
        "wandb", "annotated_types", "click", "cython_runtime", "opentelemetry", "platformdirs", "pydantic",
        "pydantic_core", "typing_inspection", "xxhash",
    },
    "mlflow": {
        "mlflow", "alembic", "annotated_doc", "annotated_types", "anyio", "cachetools", "click", "cryptography",
        "cython_runtime", "databricks", "fastapi", "git", "gitdb", "importlib_metadata", "lazy_importer", "mako",
        "opentelemetry", "pydantic", "pydantic_core", "python_multipart", "smmap", "sniffio", "sqlalchemy", "sqlparse",
        "starlette", "typing_inspection", "zipp",
    },
}  # fmt: skip


def package_name_for(project_name: str) -> str:
    """The import name derived from a project name, as copier.yml derives it."""
    return project_name.lower().replace("-", "_").replace(".", "_")


def project_name_problem(name: str) -> str | None:
    if len(name) > MAX_NAME:
        return f"the project name is {len(name)} characters long; use at most {MAX_NAME}"
    if PROJECT_NAME.match(name):
        return None
    return (
        f"{name!r} is not a valid project name: start with a letter, use only letters, digits, '.', '_' or '-', "
        "and end with a letter or digit"
    )


def package_name_problem(name: str, trackers: bool = True) -> str | None:
    """A package name must import cleanly and must not hide a module the project needs; with `trackers`, nor one
    that a --tracker imports (a project already named so is still updated: only its --tracker fails)."""
    if len(name) > MAX_NAME:
        return f"the package name is {len(name)} characters long; use at most {MAX_NAME}"
    if not PACKAGE_NAME.match(name):
        return (
            f"package name {name!r} is not a valid Python identifier for a package: start with a lowercase letter "
            "and use lowercase letters, digits and underscores, e.g. my_project"
        )
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"package name {name!r} is a Python keyword; choose another, e.g. {name}_model"
    if name in sys.stdlib_module_names or name in MAJOR_MODULES:
        return f"package name {name!r} would shadow the module {name!r}; choose another, e.g. {name}_project"
    users = [f"--tracker {tracker}" for tracker, modules in TRACKER_MODULES.items() if name in modules]
    if trackers and users:
        verb = "imports" if len(users) == 1 else "import"
        return (
            f"package name {name!r} would shadow the module {name!r}, which {' and '.join(users)} {verb}; choose "
            f"another, e.g. {name}_project"
        )
    return None


def description_problem(description: object) -> str | None:
    """The description goes into a quoted string in pyproject.toml, so it is one line of text without `"`, `\\`
    or control characters (TOML forbids those in a string)."""
    if not isinstance(description, str):
        return f"the description must be text, not {type(description).__name__} ({description!r})"
    if any(character in description for character in '"\\') or any(
        unicodedata.category(character) in ("Cc", "Cs") for character in description
    ):
        return (
            "the description must be one line without double quotes, backslashes or control characters (it goes "
            "into pyproject.toml)"
        )
    return None


def check_project_name(name: str, flag: str = "--name") -> None:
    problem = project_name_problem(name)
    if problem:
        raise LooptplError(f"{flag} {problem} (pass --name my_project)")


def check_package_name(name: str, flag: str = "--name") -> None:
    problem = package_name_problem(name)
    if problem:
        raise LooptplError(f"{flag}: {problem}")


def resolve_destination(given: str) -> Path:
    """DEST as the absolute folder it names, resolved once (symlinks followed); refused unless new or empty.

    Everything later uses this path, so nothing is written anywhere DEST does not name: not the current
    folder for `nope/..`, not the target of a dangling symlink.
    """
    if not given.strip():
        raise LooptplError("DEST is empty; name the project's folder (`.` for the current one, if it is empty)")
    path = Path(given).expanduser()
    too_long = next((part for part in path.parts if len(os.fsencode(part)) > NAME_MAX), None)
    if too_long is not None:
        raise LooptplError(
            f"DEST has a folder name of {len(os.fsencode(too_long))} bytes; file systems allow at most {NAME_MAX}"
        )
    if len(os.fsencode(os.path.abspath(path))) > PATH_MAX:
        raise LooptplError(f"DEST is {len(os.fsencode(os.path.abspath(path)))} bytes long; choose a shorter path")
    try:
        if path.name == ".." or (".." in path.parts and not _exists_before_dotdot(path)):
            raise LooptplError(
                f"DEST {given} goes up with '..' through a folder that does not exist; name the project's folder itself"
            )
        if path.is_symlink() and not path.exists():
            raise LooptplError(
                f"DEST {given} is a symbolic link to {os.readlink(path)}, which does not exist; create that folder "
                "or remove the link"
            )
        resolved = Path(os.path.realpath(path))
        check_destination(resolved)
    except OSError as error:
        raise LooptplError(f"DEST {given} cannot be used ({error.strerror}); choose another folder") from None
    return resolved


def _exists_before_dotdot(path: Path) -> bool:
    """Whether every folder that a `..` in the path leaves exists (`a/../b` is only `b` if `a` exists)."""
    return all(Path(*path.parts[:index]).is_dir() for index, part in enumerate(path.parts) if part == ".." and index)


def check_destination(destination: Path) -> None:
    """DEST must be new (or an empty folder) inside a folder we can write to."""
    if len(os.fsencode(destination)) > PATH_MAX:
        raise LooptplError(f"DEST is {len(os.fsencode(destination))} bytes long; choose a shorter path")
    if destination.exists():
        if not destination.is_dir():
            raise LooptplError(f"{destination} exists and is a file; choose a new folder for the project")
        entries = [entry.name for entry in destination.iterdir()]
        if entries and all(name.startswith(STAGING_PREFIX) for name in entries):
            raise LooptplError(
                f"{destination} holds only looptpl's temporary folders ({', '.join(sorted(entries))}): another "
                "`looptpl new` is writing there, or one was killed; if none is running, delete them and retry"
            )
        if entries:
            raise LooptplError(f"{destination} already exists and is not empty; choose a new folder or empty it")
    parent = nearest_existing_parent(destination)
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise LooptplError(f"cannot write to {parent}; choose a destination in a folder you can write to")
    checkout = template_source.template_root()
    if template_source.is_git_checkout(checkout) and destination.resolve().is_relative_to(checkout.resolve()):
        # Copier reads a checkout's template through git: a project written inside it makes the checkout dirty.
        raise LooptplError(
            f"{destination} is inside the looptpl checkout {checkout}, whose template copier reads through git; "
            "choose a folder outside it"
        )


def nearest_existing_parent(path: Path) -> Path:
    """The closest folder above `path` that exists (where new folders would be created)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")
