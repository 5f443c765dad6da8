"""Find the TODOs a generated project still asks the user to fill in."""

import re
from dataclasses import dataclass
from pathlib import Path

from looptpl.errors import LooptplError

TODO = re.compile(r"#\s*TODO(?:\((?P<topic>[^)]*)\))?:?\s*(?P<text>.*)")


@dataclass(frozen=True)
class Todo:
    path: Path
    line: int
    topic: str
    text: str


# The order to fill the user files in: the data first (its sizes shape the model), then the model, the step
# that calls it, the loss and metrics it returns, the optimizer, and the settings all of them grew.
FILL_ORDER = ("data", "model", "step", "loss", "metrics", "optim", "settings", "hooks")


def find_todos(project: Path) -> list[Todo]:
    """Every `# TODO(topic): text` comment under the project's src/ and tests/, in the order to fill them in.

    A TODO's text goes on over the comment lines right below it (same indent, no TODO of their own).
    """
    if not (project / ".copier-answers.yml").is_file():
        raise LooptplError(f"{project} is not a looptpl project (no .copier-answers.yml); pass the project folder")
    todos = []
    for folder in ("src", "tests"):
        for path in sorted((project / folder).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines, start=1):
                match = TODO.search(line)
                if match:
                    text = " ".join([match["text"].strip(), *_continuation(lines, number, line)]).strip()
                    todos.append(Todo(path.relative_to(project), number, match["topic"] or "", text))
    return sorted(todos, key=_fill_rank)


def _continuation(lines: list[str], number: int, first: str) -> list[str]:
    """The comment lines that carry on the TODO on line `number` (1-based)."""
    indent = first[: len(first) - len(first.lstrip())]
    carried = []
    for line in lines[number:]:
        if not line.startswith(indent + "# ") or TODO.search(line):
            break
        carried.append(line[len(indent) + 2 :].strip())
    return carried


def _fill_rank(todo: Todo) -> tuple[int, str, int]:
    stem = todo.path.stem
    rank = FILL_ORDER.index(stem) if stem in FILL_ORDER else len(FILL_ORDER)
    return rank, str(todo.path), todo.line
