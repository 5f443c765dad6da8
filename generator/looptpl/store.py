"""The template store: one git repository per user holding each installed looptpl's template under a tag.

Copier merges template changes into a project by rendering its old and its new template from git
refs. An installed looptpl has only its own template on disk, so the first time a version runs it
commits that template (copier.yml and templates/) to the store and tags it `v<version>`. The
commit has no parent and a fixed author, date and message, so a version's tag names the same commit
on every machine. Generated projects record the store as `_src_path` and the tag as `_commit`.

In a development checkout the repository itself is the template: nothing is stored there.

Storing runs git five times, so once a version's tag is known to hold exactly the installed template,
a stamp in the store says so: later runs hash the template files (milliseconds) and run no git.
"""

import hashlib
import os
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import looptpl
from looptpl import template_source
from looptpl.errors import LooptplError
from looptpl.gitcmd import FALLBACK_IDENTITY, git, require_git
from looptpl.progress import phase

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
    checkout: bool  # a development checkout rather than the store

    @property
    def path(self) -> Path:
        return Path(self.url).expanduser()

    @cached_property
    def label(self) -> str:
        """The version as messages name it: the tag, or `git describe` of the checkout (asked only when shown)."""
        if not self.checkout:
            return self.ref
        return "checkout " + git("describe", "--tags", "--always", "HEAD", cwd=self.path).strip()


def installed_template() -> TemplateRef:
    """The template of this looptpl, stored under its version tag first when installed."""
    root = template_source.template_root()
    if template_source.is_git_checkout(root):
        require_git("the template of a development checkout is read through git")
        return TemplateRef(str(root), "HEAD", checkout=True)
    tag = f"v{looptpl.__version__}"
    store = store_path()
    add_version(store, root, tag)
    return TemplateRef(portable(store), tag, checkout=False)


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
    stamp = store / ".git" / "looptpl-stamps" / f"{tag}-{_template_digest(root)}"
    if stamp.is_file() and _loose_tag(store, tag) == stamp.read_text(encoding="utf-8"):
        return  # this very template was stored under this tag before, and the tag still names that commit
    with phase(f"Storing the template of looptpl {looptpl.__version__} in {portable(store)}..."):
        commit = _store(store, root, tag)
    try:
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(commit, encoding="utf-8")
    except OSError:
        pass  # only a shortcut for the next run


def _store(store: Path, root: Path, tag: str) -> str:
    """Commit the template to the store and tag it; the tag's commit (an error if it holds another template)."""
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
    return commit


def _template_digest(root: Path) -> str:
    """A hash of what `_commit_template` stores: each template file's path, executable bit and bytes."""
    digest = hashlib.sha256()
    paths = [root / TEMPLATE_PATHS[0], *sorted((root / TEMPLATE_PATHS[1]).rglob("*"))]
    for path in paths:
        if "__pycache__" in path.parts or path.suffix == ".pyc" or path.is_dir():
            continue
        link = path.is_symlink()
        content = os.readlink(path).encode() if link else path.read_bytes()
        executable = not link and bool(path.stat().st_mode & 0o111)
        digest.update(f"{path.relative_to(root).as_posix()}\0{link:d}{executable:d}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()[:32]


def _loose_tag(store: Path, tag: str) -> str | None:
    """The commit the tag names, read from its ref file (as update-ref wrote it); None if packed or missing."""
    try:
        return (store / ".git" / "refs" / "tags" / tag).read_text(encoding="utf-8").strip()
    except OSError:
        return None


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
