"""What changed between two template versions, as the template's CHANGELOG.md says it.

`looptpl update` prints the entries after the project's version up to the new one: whether results
change for the same seed, what your files must now define, what moved.
"""

import re

HEADING = re.compile(r"^## v?(\d+(?:\.\d+)*)\b.*$", re.MULTILINE)  # "## 1.2.0 (2026-11-27)"
PATH = "templates/CHANGELOG.md"  # in the template's tree: it ships wherever the template does


def between(changelog: str, current: str, new: str) -> list[str]:
    """The sections of the versions after `current` up to `new` (tags such as v1.2.0), as written (newest
    first), each with its heading; none where either is not a release version (a development checkout)."""
    try:
        low, high = _version(current), _version(new)
    except ValueError:
        return []
    headings = list(HEADING.finditer(changelog))
    ends = [heading.start() for heading in headings[1:]] + [len(changelog)]
    return [
        changelog[heading.start() : end].strip()
        for heading, end in zip(headings, ends, strict=True)
        if low < _version(heading[1]) <= high
    ]


def _version(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in tag.removeprefix("v").split("."))
