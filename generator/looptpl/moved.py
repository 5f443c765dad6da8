"""Find the user's edits to template code that a new template version moved or removed.

Copier replays a user's edit where it was made. When the new template version moved that code to
another file (the train step from engine.py to train_step.py, say), the edit either clashes with
the removal or, worse, lands as a block that nothing calls any more: the project then trains
without it, silently. An update looks for such edits before merging: an edit is stranded when
every template line it changed, and every one around it, is gone from that file in the new
version. Where most of those lines now are in another file, that is where the code went.
"""

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path

CONTEXT = 2  # template lines on each side of an edit that place it
MEANINGFUL = 12  # characters a stripped line needs to identify code (not `)`, `else:` or `return x`)


@dataclass(frozen=True)
class StrandedEdit:
    path: str  # the file the user edited
    first: int  # the edit's lines in the user's file, 1-based and inclusive
    last: int
    moved_to: str  # the new file that holds most of the template code the edit changed; "" if none does
    text: tuple[str, ...] = ()  # the edit's lines (none for an edit that only deleted template lines)
    removed: bool = False  # the update removed the file: the user's version is in the last commit only

    def relocated(self, project: Path) -> "StrandedEdit":
        """The same edit, at its lines in the file as the merge left it (where it is still there whole), so
        that the message points at what the user sees after the update."""
        if not (project / self.path).exists():
            return dataclasses.replace(self, removed=True)
        lines = _lines(project / self.path) or []
        size = len(self.text)
        for start in range(len(lines) - size + 1) if size else ():
            if tuple(lines[start : start + size]) == self.text:
                return dataclasses.replace(self, first=start + 1, last=start + size)
        return self

    def describe(self) -> str:
        where = f"{self.path} line {self.first}" + (f"-{self.last}" if self.last > self.first else "")
        # The path is the project's, as `git show` run in the project reads it (HEAD:./ is relative to it).
        gone = f" (the update removed the file: `git show HEAD:./{self.path}` shows yours)" if self.removed else ""
        if self.moved_to:
            return f"{where}: that template code is now in {self.moved_to}{gone}"
        return f"{where}: that template code is gone from the new version{gone}"


def stranded_edits(project: Path, old: Path, new: Path, paths: list[str]) -> list[StrandedEdit]:
    """The user's edits to `paths` (files the template manages, as the project has them now) whose
    template code `new` no longer has in that file; `old` is the project's template version rendered."""
    new_files = {path.relative_to(new).as_posix(): _identifying(path) for path in new.rglob("*") if path.is_file()}
    found = []
    for name in paths:
        before, mine = old / name, project / name
        if not (before.is_file() and mine.is_file()):
            continue
        template, user = _lines(before), _lines(mine)
        if template is None or user is None:
            continue
        remaining = new_files.get(name, set())
        matcher = difflib.SequenceMatcher(None, template, user, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            # The template lines the edit changed and those around it: code rewritten in place keeps
            # some of its surroundings, moved or removed code takes them along.
            region = template[max(0, i1 - CONTEXT) : i2 + CONTEXT]
            anchors = {line.strip() for line in region if len(line.strip()) >= MEANINGFUL}
            if not anchors or anchors & remaining:
                continue  # the template still has (some of) that code here: copier merges the edit in place
            holders = {other: len(anchors & lines) for other, lines in new_files.items() if other != name}
            best = max(holders, key=lambda other: holders[other], default="")
            moved_to = best if best and 2 * holders[best] >= len(anchors) else ""
            found.append(StrandedEdit(name, j1 + 1, max(j1 + 1, j2), moved_to, tuple(user[j1:j2])))
    return found


def _lines(path: Path) -> list[str] | None:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None


def _identifying(path: Path) -> set[str]:
    """The file's stripped lines long enough to identify code."""
    return {line.strip() for line in _lines(path) or [] if len(line.strip()) >= MEANINGFUL}
