"""Rename a project's package (src/<old> -> src/<new>) so that later updates follow it.

Copier cannot follow a renamed package: it merges from the project's template version rendered
with the recorded package name, so a package moved by hand gets the template's fixes in a stray
src/<old>/, and `copier update -d package_name=<new>` renders the new name but drops the files the
user filled in. A rename here does what rendering the project with the new name would have done,
and keeps the user's edits: each file the template makes is merged three ways (the project's
template version rendered with the old name as the base, the user's file, the same version rendered
with the new name), and imports of the package in the user's own files follow.
"""

import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from looptpl import compiled
from looptpl.answers import ANSWERS, check_package, read_answers
from looptpl.errors import LooptplError
from looptpl.gitcmd import git
from looptpl.links import refuse_links
from looptpl.progress import phase
from looptpl.update import (
    Status,
    check_no_markers,
    check_repository,
    copier_failures,
    plan_update,
    put_back,
)
from looptpl.validation import package_name_problem


@dataclass(frozen=True)
class Renamed:
    old: str
    new: str
    changed: list[str] = field(default_factory=list)  # `git status` lines
    # Files where the user's edits and the rename change the same lines (they hold conflict markers).
    conflicts: list[str] = field(default_factory=list)
    mentions: list[str] = field(default_factory=list)  # "path:line: text" where the old name is still written


def rename_package(project: Path, new: str) -> Renamed:
    """Rename the project's package to `new` in the working tree (uncommitted, for review)."""
    answers = read_answers(project)
    old = answers["package_name"]
    problem = package_name_problem(new)
    if problem:
        raise LooptplError(f"{problem} (looptpl rename NEW_NAME)")
    if new == old:
        raise LooptplError(f"the package is already named {old}; pass another name")
    if (project / "src" / new).exists():
        raise LooptplError(f"src/{new} already exists; remove it or choose another name")
    top = check_repository(project)
    check_no_markers(project, "rename")
    check_package(project, answers)
    plan = plan_update(project, answers)
    if plan.status is Status.NEWER:
        raise LooptplError(
            f"{project} uses template {plan.current}, newer than this looptpl's {plan.template.label}; upgrade "
            "looptpl (pip install -U looptpl) to rename it"
        )
    try:
        with tempfile.TemporaryDirectory(prefix="looptpl-rename-") as scratch:
            with phase(f"Rendering template {plan.current} with both names..."):
                before, after = _render_both(plan.template.path, plan.current, answers, new, Path(scratch))
            written = [path.relative_to(before).as_posix() for path in before.rglob("*") if path.is_file()]
            refuse_links(project, [*written, *_links_to_fix(project, old, new)], "rename")
            git("mv", f"src/{old}", f"src/{new}", cwd=project)
            git("clean", "-d", "-X", "--force", "--quiet", "--", f"src/{old}", cwd=project)  # caches left behind
            rendered, conflicts = _merge_rendered(project, before, after, old, new)
        _fix_imports(project, rendered, old, new)
    except BaseException:
        put_back(top)
        raise
    changed = git("status", "--porcelain", "--", ".", cwd=project).splitlines()
    return Renamed(old, new, changed, conflicts, _mentions(project, old))


def _render_both(template: Path, ref: str, answers: dict[str, object], new: str, scratch: Path) -> tuple[Path, Path]:
    """The project's template version rendered with the recorded answers, and with the new package name."""
    copier = compiled.copier()

    data = {key: value for key, value in answers.items() if not key.startswith("_")}
    with copier_failures("rendered"):
        for folder, values in ((scratch / "before", data), (scratch / "after", {**data, "package_name": new})):
            copier.run_copy(str(template), folder, data=values, vcs_ref=ref, defaults=True, quiet=True)
    return scratch / "before", scratch / "after"


def _merge_rendered(project: Path, before: Path, after: Path, old: str, new: str) -> tuple[set[str], list[str]]:
    """Merge the rename into every file the template renders that the project still has; returns those
    files and the ones with conflict markers."""
    rendered: set[str] = set()
    conflicts: list[str] = []
    for path in sorted(after.rglob("*")):
        name = path.relative_to(after).as_posix()
        base = before / re.sub(rf"^src/{new}/", f"src/{old}/", name)
        mine = project / name
        if not (path.is_file() and base.is_file() and mine.is_file()):
            continue  # a file the user deleted stays deleted
        rendered.add(name)
        labels = ["-L", "yours", "-L", f"package {old}", "-L", f"package {new}"]
        result = subprocess.run(
            ["git", "merge-file", "-p", *labels, str(mine), str(base), str(path)], capture_output=True
        )
        if result.returncode < 0 or result.returncode > 127:
            raise LooptplError(f"git merge-file failed on {name}: {result.stderr.decode(errors='replace').strip()}")
        mine.write_bytes(result.stdout)
        if result.returncode > 0:
            conflicts.append(name)
    return rendered, conflicts


def _fix_imports(project: Path, rendered: set[str], old: str, new: str) -> None:
    """Point the user's own files (the ones the template does not render) at the new package name:
    `import old`, `from old...`, and dotted paths to its modules (`-m old.train`, "old.model")."""
    modules = _modules(project / "src" / new)
    for name in git("ls-files", cwd=project).splitlines():
        path = project / name
        if name in rendered or path.is_symlink() or not path.is_file():
            continue  # a link is left as it is (rename_package refused the ones whose imports need it)
        text = _text(path)
        fixed = _renamed_imports(text, modules, old, new) if text is not None else None
        if fixed is not None and fixed != text:
            path.write_text(fixed, encoding="utf-8")


def _links_to_fix(project: Path, old: str, new: str) -> list[str]:
    """The symbolic links the project tracks whose text imports the package, before the rename (read only)."""
    entries = git("ls-files", "-s", "-z", cwd=project).split("\0")  # "mode hash stage\tpath"
    links = [entry.split("\t", 1)[1] for entry in entries if entry.startswith("120000 ")]
    modules = _modules(project / "src" / old)
    texts = {name: _text(project / name) for name in links}
    return [name for name, text in texts.items() if text and _renamed_imports(text, modules, old, new) != text]


def _modules(package: Path) -> str:
    """The package's modules, as alternatives of a regular expression."""
    return "|".join(sorted(path.stem for path in package.glob("*.py")))


def _renamed_imports(text: str, modules: str, old: str, new: str) -> str:
    """`text` with its imports of `old`, and dotted paths to its `modules`, naming `new` instead."""
    fixed = re.sub(rf"\b(from|import)\s+{old}\b", rf"\1 {new}", text)
    return re.sub(rf"(?<![\w.]){old}\.(?=({modules})\b)", f"{new}.", fixed)


def _mentions(project: Path, old: str) -> list[str]:
    """Lines of the project's text files that still name the old package, for the user to check."""
    word = re.compile(rf"\b{old}\b")
    found = []
    for name in git("ls-files", cwd=project).splitlines():
        text = _text(project / name) if name != ANSWERS else None
        for number, line in enumerate((text or "").splitlines(), 1):
            if word.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    return found


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary or unreadable file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
