"""How `looptpl update` leaves a template change that clashes with a user edit.

A module of its own so that the CLI can offer the choices at start-up without importing update.py.
"""

from enum import Enum


class Conflict(str, Enum):
    """Inline conflict markers in the file, or a `.rej` file beside it."""

    inline = "inline"
    rej = "rej"
