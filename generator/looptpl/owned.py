"""Your files across an update: an update never writes them, so it shows what the template changed in them.

For each file you own (copier.yml's `_skip_if_exists`) whose template version changed between the
project's version and the new one: a unified diff of the template's change, and that change merged
into your copy (three-way), written beside it as FILE.merged (or, on request, into your file).
"""

import difflib
import subprocess
from pathlib import Path

from looptpl.gitcmd import git
from looptpl.store import TemplateRef
from looptpl.template_source import copier_config


def owned_names(template: TemplateRef, package: str) -> list[str]:
    """The files the user owns (copier.yml's `_skip_if_exists`), as paths in the project."""
    text = template_text(template, "copier.yml")
    return [entry.replace("{{ package_name }}", package) for entry in copier_config(text)["_skip_if_exists"]]


def template_text(template: TemplateRef, name: str) -> str:
    """A file of the template that copier merges from ("" where it has none)."""
    if template.checkout:  # the working tree, uncommitted edits included, as copier renders it
        path = template.path / name
        return path.read_text(encoding="utf-8") if path.is_file() else ""
    return git("show", f"{template.ref}:{name}", cwd=template.path, check=False)


def changed_in_template(old: Path, new: Path, owned: list[str]) -> list[str]:
    """The user's files whose template version differs between the old render and the new one."""
    return [
        name
        for name in owned
        if (old / name).is_file() and (new / name).is_file() and (old / name).read_text() != (new / name).read_text()
    ]


def owned_changes(versions: tuple[str, str], old: Path, new: Path, changed: list[str]) -> list[str]:
    """Unified diffs of the template's own versions of the user-owned files it `changed`, from the project's
    template version (and answers) to the new one: an update keeps the user's files as they are, so a changed
    default (a fixed epsilon in optim.py, say), or a function a new --strategy calls (FSDP's
    shard_units in model.py), would never arrive without the user applying it by hand."""
    diffs = []
    for name in changed:
        before, after = (old / name).read_text(), (new / name).read_text()
        diff = difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            name,
            name,
            f"(template {versions[0]})",  # after a tab: `patch -p0` and `git apply -p0` read the name
            f"(template {versions[1]})",
        )
        diffs.append("".join(diff))
    return diffs


def merge_into_yours(
    project: Path, versions: tuple[str, str], old: Path, new: Path, changed: list[str], in_place: bool = False
) -> list[tuple[str, int]]:
    """For each of your files whose template version `changed`, the change merged into your copy (a
    three-way merge: the template's old version, yours, its new one), written beside it as FILE.merged
    for you to review and move over, your file left as it is; or, `in_place`, into your file itself, with
    conflict markers where your edits and the change touch the same lines. Returns (the file written, its
    number of conflicts) for each."""
    written = []
    labels = ["yours", f"template {versions[0]}", f"template {versions[1]}"]
    for name in changed:
        yours, before, after = project / name, old / name, new / name
        if not yours.is_file():
            continue
        command = ["merge-file", "-p", *(option for label in labels for option in ("-L", label))]
        result = subprocess.run(["git", *command, str(yours), str(before), str(after)], capture_output=True)
        if result.returncode < 0 or result.returncode > 127 or result.stdout == yours.read_bytes():
            continue  # git could not merge it, or the change is in your copy already
        target = yours if in_place else yours.with_name(yours.name + ".merged")
        target.write_bytes(result.stdout)
        written.append((str(target.relative_to(project)), result.returncode))  # git merge-file's status: conflicts
    return written
