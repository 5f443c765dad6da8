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


def find_todos(project: Path) -> list[Todo]:
    """Every `# TODO(topic): text` comment under the project's src/ and tests/, in file order."""
    if not (project / ".copier-answers.yml").is_file():
        raise LooptplError(f"{project} is not a looptpl project (no .copier-answers.yml); pass the project folder")
    todos = []
    for folder in ("src", "tests"):
        for path in sorted((project / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                match = TODO.search(line)
                if match:
                    todos.append(Todo(path.relative_to(project), number, match["topic"] or "", match["text"].strip()))
    return todos
