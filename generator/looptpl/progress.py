"""Progress on stderr for work that takes seconds, shown only when stderr is a terminal.

Scripts, CI logs and tests see nothing; a person sees a spinner with the current phase. Phases nest:
an inner one (storing the template on first use) replaces the text of the outer one (an update) and
gives it back when done, because a terminal shows one live spinner at a time.
"""

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_shown: list[Any] = []  # the one rich Status on screen, while there is one


@contextmanager
def phase(message: str) -> Iterator[None]:
    """Show `message` with a spinner on stderr while the block runs (if stderr is a terminal)."""
    if not sys.stderr.isatty():
        yield
        return
    if _shown:
        status = _shown[-1]
        outer = status.status
        status.update(message)
        try:
            yield
        finally:
            status.update(outer)
        return
    from rich.console import Console  # imported here: ~0.1 s, and only a terminal needs it

    with Console(stderr=True).status(message) as status:
        _shown.append(status)
        try:
            yield
        finally:
            _shown.pop()
