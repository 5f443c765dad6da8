"""Progress on stderr for work that takes seconds, shown only when stderr is a terminal.

Scripts, CI logs and tests see nothing; a person sees a spinner with the current phase.
"""

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def phase(message: str) -> Iterator[None]:
    """Show `message` with a spinner on stderr while the block runs (if stderr is a terminal).

    Phases follow one another; none runs inside another (a terminal shows one live spinner at a time).
    """
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console  # imported here: ~0.1 s, and only a terminal needs it

    with Console(stderr=True).status(message):
        yield
