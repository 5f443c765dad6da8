"""Problems a user can fix. Managed by the looptpl template.

train.py turns each into one message and an exit code; the message names the flag or the file
to change.
"""

import re


class RunError(Exception):
    """A run that cannot start or go on."""

    exit_code = 1


class ConfigError(RunError):
    """A flag value that cannot work."""

    exit_code = 2


class DataError(RunError):
    """Data from data.py, loss.py or metrics.py that the loop cannot use."""


class TrainingError(RunError):
    """Training went wrong (a NaN loss, say)."""


class CheckpointError(RunError):
    """No usable checkpoint where one was expected."""


def first_line(error: Exception) -> str:
    """The first line of an error's cause, without where TensorFlow ran or traced the failing graph."""
    message = getattr(error, "message", None) or str(error)
    where = r"\{\{function_node [^}]*\}\}|Graph execution error:|Detected at node .*|^\s*File .*"
    lines = [line.strip() for line in re.sub(where, "", message, flags=re.MULTILINE).splitlines()]
    return next((line for line in lines if line), type(error).__name__)
