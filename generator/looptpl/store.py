"""The template store: one git repository per user holding each installed looptpl's template under a tag.

Copier merges template changes into a project by rendering its old and its new template from git
refs. An installed looptpl has only its own template on disk, so the first time a version runs it
commits that template (copier.yml and templates/) to the store and tags it `v<version>`. The
commit has no parent and a fixed author, date and message, so a version's tag names the same commit
on every machine. Generated projects record the store as `_src_path` and the tag as `_commit`.

In a development checkout the repository itself is the template: nothing is stored there.
"""

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import looptpl
from looptpl import template_source
from looptpl.errors import LooptplError
from looptpl.gitcmd import FALLBACK_IDENTITY, git, require_git

HOME_ENV = "LOOPTPL_HOME"
TEMPLATE_PATHS = ("copier.yml", "templates")
NOT_TEMPLATE = (":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.pyc")
# A fixed identity and date make the commit a function of the template alone.
COMMIT_ENV = {
    **FALLBACK_IDENTITY,
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
NO_COMMIT = "0" * 40


@dataclass(frozen=True)
class TemplateRef:
    """Where copier reads this looptpl's template, and at which git ref."""

    url: str  # what copier is given as the source and records as `_src_path`
    ref: str  # a version tag in the store, or HEAD in a development checkout
    label: str  # the version as messages name it: the tag, or `git describe` of the checkout
    checkout: bool  # a development checkout rather than the store

    @property
    def path(self) -> Path:
        return Path(self.url).expanduser()


def installed_template() -> TemplateRef:
    """The template of this looptpl, stored under its version tag first when installed."""
    root = template_source.template_root()
    if template_source.is_git_checkout(root):
        require_git("the template of a development checkout is read through git")
        label = git("describe", "--tags", "--always", "HEAD", cwd=root).strip()
        return TemplateRef(str(root), "HEAD", f"checkout {label}", checkout=True)
    tag = f"v{looptpl.__version__}"
    store = store_path()
    add_version(store, root, tag)
    return TemplateRef(portable(store), tag, tag, checkout=False)


def store_path() -> Path:
    """`$LOOPTPL_HOME/template`, by default `~/.local/share/looptpl/template` (XDG_DATA_HOME is honoured)."""
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home).expanduser().absolute() / "template"
    data = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data) if os.path.isabs(data) else Path.home() / ".local" / "share"
    return base / "looptpl" / "template"


def portable(path: Path) -> str:
    """The path with the home folder written as `~`, so answers files work for every user and machine."""
    try:
        return "~/" + path.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(path)


def add_version(store: Path, root: Path, tag: str) -> None:
    """Make `tag` in the store name the template at `root`; refuse if it already names a different one."""
    require_git("looptpl keeps the template of each version in a git repository to update projects")
    if not (store / ".git").is_dir():
        try:
            store.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise LooptplError(
                f"cannot create the template store {store} ({error.strerror}); set {HOME_ENV} to a folder you can "
                "write to",
                exit_code=1,
            ) from None
        git("init", "--quiet", cwd=store)
    commit = _commit_template(store, root, tag)
    stored = _tag_commit(store, tag)
    if stored is None:
        # Atomic: if another looptpl created the tag meanwhile, this fails and the check below decides.
        git("update-ref", f"refs/tags/{tag}", commit, NO_COMMIT, cwd=store, check=False)
        stored = _tag_commit(store, tag)
    if stored != commit:
        raise LooptplError(
            f"the template store {store} holds a different template under {tag} than looptpl "
            f"{looptpl.__version__} ships (edited without a version bump?); bump the version, or if no project "
            f"uses the stored one, delete it with `git -C {store} tag -d {tag}`",
            exit_code=1,
        )


def has_tag(store: Path, tag: str) -> bool:
    return (store / ".git").is_dir() and _tag_commit(store, tag) is not None


def _tag_commit(store: Path, tag: str) -> str | None:
    commit = git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}", cwd=store, check=False).strip()
    return commit or None


def _commit_template(store: Path, root: Path, tag: str) -> str:
    """Write the template at `root` as a parentless commit in the store, through a throwaway index."""
    with tempfile.TemporaryDirectory(prefix="looptpl-index-") as scratch:
        env = {**COMMIT_ENV, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        # --force: the template's own .gitignore files must not drop template files.
        with_store = ("-c", "core.autocrlf=false", f"--git-dir={store / '.git'}", f"--work-tree={root}")
        git(*with_store, "add", "--force", "--", *TEMPLATE_PATHS, *NOT_TEMPLATE, cwd=root, env=env)
        tree = git(*with_store, "write-tree", cwd=root, env=env).strip()
        message = f"looptpl template {tag}"
        return git(*with_store, "commit-tree", "--no-gpg-sign", "-m", message, tree, cwd=root, env=env).strip()
