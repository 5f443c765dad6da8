"""Symbolic links in a project: `looptpl update` and `looptpl rename` write only the project's own files.

A file the project tracks as a symbolic link (or one inside a linked folder) is where the link points,
perhaps outside the project: a write there is one that `git reset --hard` cannot undo. Copier, for
its part, replaces such a link with the rendered file and then puts the link back, dropping the
template's change without a word. So a command that would write through a link refuses, before it
changes anything, and says which link.
"""

import os
from collections.abc import Iterable
from pathlib import Path

from looptpl.errors import LooptplError


def links_among(project: Path, names: Iterable[str]) -> list[str]:
    """The symbolic links (paths in the project) that any of `names` is, or lies under."""
    found: set[str] = set()
    for name in names:
        path = project
        for part in Path(name).parts:
            path = path / part
            if path.is_symlink():
                found.add(path.relative_to(project).as_posix())
                break
            if not path.exists():
                break
    return sorted(found)


def refuse_links(project: Path, names: Iterable[str], command: str) -> None:
    """Refuse, in one line naming each link and where it points, a command that would write at `names`."""
    links = links_among(project, names)
    if not links:
        return
    shown = ", ".join(f"{name} is a symbolic link (to {os.readlink(project / name)})" for name in links[:3])
    more = f" and {len(links) - 3} more links" if len(links) > 3 else ""
    raise LooptplError(
        f"{shown}{more}, where `looptpl {command}` must write; it writes nothing through a link (it may point outside "
        f"the project, where git cannot undo a change): replace the link with a copy of what it points to, commit, "
        f"then {command} again"
    )
