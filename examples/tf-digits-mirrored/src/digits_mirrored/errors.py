"""Problems a user can fix. Managed by the looptpl template.

train.py turns each into one message and an exit code; the message names the flag or the file
to change.
"""


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
