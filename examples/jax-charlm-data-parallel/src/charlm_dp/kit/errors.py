"""Problems a user can fix. Managed by the looptpl template.

train.py turns each into one message and an exit code; the message names the flag or the file
to change.
"""

import contextlib
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax


class RunError(Exception):
    """A run that cannot start or go on."""

    exit_code = 1
    # Raised alike on every process (from values all of them reduced, or code all of them traced): one
    # of them prints it (errors.report) and all leave together.
    on_every_rank = True


class ConfigError(RunError):
    """A flag value that cannot work."""

    exit_code = 2


class TrackerError(ConfigError):
    """A --tracker that cannot start, or its tracker.json: raised where it logs, by process 0 alone."""

    on_every_rank = False


class DataError(RunError):
    """Data or objects from your files (data.py, model.py, optim.py, ...) that the loop cannot use."""

    on_every_rank = False  # a process's own part of the data, say


class TrainingError(RunError):
    """Training went wrong (a NaN loss, say)."""


class CheckpointError(RunError):
    """No usable checkpoint where one was expected."""


def first_line(error: Exception) -> str:
    """The first line of an error's message, without JAX's notes on where it was traced."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


class StepError(DataError):
    """What step.py, metrics.py or loss.py returned or raised while the step was traced."""

    on_every_rank = True  # every process traces the same step


USER_FILES = ("data.py", "model.py", "loss.py", "metrics.py", "optim.py", "step.py", "settings.py", "hooks.py")


def in_your_files(places: Iterable[tuple[Path, int | None]]) -> list[str]:
    """`file:line` of each place (a file and a line) that is in one of your files of this package, in order."""
    package = Path(__file__).parents[1]  # src/PKG: your files and train.py
    return [f"{path.name}:{line}" for path, line in places if path.parent == package and path.name in USER_FILES]


def user_code_error(error: Exception, doing: str) -> Exception:
    """One line for an exception raised in your code while JAX traced it: your file and line.

    Errors that did not pass through a user file are the template's: they keep their traceback.
    """
    places = [(Path(frame.filename), frame.lineno) for frame in traceback.extract_tb(error.__traceback__)]
    mine = in_your_files(places)
    if not mine:
        return error
    if isinstance(error, RunError):  # one of ours, raised on a value your code passed: say where
        return type(error)(f"{mine[-1]}: {error}")
    if isinstance(error, jax.errors.ConcretizationTypeError | jax.errors.TracerBoolConversionError):
        return StepError(
            f"{mine[-1]} failed {doing}: an array's value used in Python (`if`, `int()`, a shape); the step is traced "
            "once for all batches, so decide with jnp.where or jax.lax.cond, and take shapes from .shape"
        )
    return StepError(f"{mine[-1]} failed {doing}: {type(error).__name__}: {first_line(error)}")


def three_datasets(returned: object) -> tuple[Any, Any, Any]:
    """data.py's (train, val, test; the test set may be None), or a DataError saying what build_datasets
    returned instead."""
    if isinstance(returned, tuple | list) and len(returned) == 3:
        missing = [split for split, dataset in zip(("train", "val"), returned, strict=False) if dataset is None]
        if missing:
            raise DataError(
                f"data.py: build_datasets returned None for the {missing[0]} set; only the test set may be None "
                "(the run then has no final test)"
            )
        return returned[0], returned[1], returned[2]
    if returned is None:
        got = "None"
    elif isinstance(returned, tuple | list | dict):
        got = f"a {type(returned).__name__} of {len(returned)}"
    else:
        got = f"a {type(returned).__name__}"
    raise DataError(f"data.py: build_datasets must return (train, val, test) datasets, got {got}")


class in_your_code:
    """Around a call of your code (build_model, build_optimizer, ...): an exception raised in one of your
    files becomes one line naming its file and line, `optim.py:22 failed building the optimizer: ...`.

    `hint` ends that line when the error is about a dict: code written for one model, given several.
    A class, not a generator: it wraps train_step at every micro-step, and costs a third as much.
    """

    def __init__(self, doing: str, hint: str = "") -> None:
        self.doing, self.hint = doing, hint

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        if not isinstance(error, Exception):
            return  # no exception, or Ctrl-C and the like: left as they are
        problem = user_code_error(error, self.doing)
        if problem is error:
            return  # one of ours, with no file of yours on its way: it goes on as it is
        if self.hint and re.search(r"\bdict\b", str(problem)):
            problem = type(problem)(f"{problem}; {self.hint}")
        raise problem from None


def first_rank() -> bool:
    """Whether this process speaks for all: rank 0 under torchrun (or worker 0 of TensorFlow's
    kit/launch.py, which numbers its workers alike), or a process on its own."""
    return os.environ.get("RANK", "0") == "0"


def report(message: str, every_rank: bool = True) -> None:
    """Print the line that ends a failed run, once: from rank 0 when every rank stops alike, from the
    rank it happened on otherwise. Under torchrun it also goes into the rank's error file, which
    torchrun's closing summary quotes as the root cause (instead of `error_file: <N/A>`)."""
    line = message.strip().splitlines()[-1] if message.strip() else message
    if not every_rank or first_rank():
        # One write, newline included: lines from ranks failing at once are not glued together.
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
    if error_file := os.environ.get("TORCHELASTIC_ERROR_FILE"):
        with contextlib.suppress(OSError):
            Path(error_file).write_text(json.dumps({"message": line, "timestamp": int(time.time())}))
        if every_rank and not first_rank():
            _wait_for_the_first_local_rank(Path(error_file))


def _wait_for_the_first_local_rank(error_file: Path) -> None:
    """Wait (10 s at most) until local rank 0 has written its error file, so has printed its line.

    torchrun stops every rank as soon as one exits: leaving first, this rank could stop rank 0 before it
    says why, a mistake found before the ranks join (at import, in a flag) leaving no line at all.
    """
    if error_file.parent.name != os.environ.get("LOCAL_RANK"):
        return  # not torchrun's layout (ATTEMPT/LOCAL_RANK/error.json): nothing to wait for
    first = error_file.parent.parent / "0" / error_file.name
    deadline = time.monotonic() + 10.0
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def import_failure(error: Exception) -> str | None:
    """One line for an error raised as train.py imported this package, so your files: a syntax error's
    file and line, a name the template imports but a file lacks, or the line of yours that raised;
    None for an error of the template's own code."""
    package = Path(__file__).parents[1]  # src/PKG: your files and train.py
    if isinstance(error, SyntaxError) and error.filename and package in Path(error.filename).parents:
        file = Path(error.filename).relative_to(package)
        return (
            f"{file}:{error.lineno}: {type(error).__name__}: {error.msg}; fix this line "
            "(python -m compileall -q src lists any others)"
        )
    if isinstance(error, ImportError) and error.path and Path(error.path).parent == package:  # a name gone
        message = (error.msg or "").partition(" (")[0]
        return f"{Path(error.path).name}: {message}; the template's code imports that name from there, so keep it"
    mine = in_your_files((Path(frame.filename), frame.lineno) for frame in traceback.extract_tb(error.__traceback__))
    if not mine:
        return None
    message = str(error).strip().partition("\n")[0]
    return f"{mine[-1]} failed on import: {type(error).__name__}: {message}"
