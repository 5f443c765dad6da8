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

# The files of this package that hold your code: an error raised in them is reported by file and line.
USER_FILES = ("data.py", "model.py", "step.py", "loss.py", "metrics.py", "optim.py", "settings.py", "hooks.py")


# How a failed collective reads (a forward can be one): train.py explains those, not as a mistake in your code.
COLLECTIVE_FAILURES = ("timed out", "Timed out", "Connection closed by peer", "Connection reset by peer", "NCCL")


class RunError(Exception):
    """A run that cannot start or go on."""

    exit_code = 1
    # Raised alike on every rank (from all-reduced values), so the ranks can still leave together.
    on_every_rank = True


class ConfigError(RunError):
    """A flag value that cannot work."""

    exit_code = 2


class TrackerError(ConfigError):
    """A --tracker that cannot start, or its tracker.json: raised where it logs, on one rank alone."""

    on_every_rank = False


class DataError(RunError):
    """Data from data.py that the loop cannot use."""

    on_every_rank = False


class StepError(RunError):
    """What your code returned or raised on one batch, on one rank."""

    on_every_rank = False


class TrainingError(RunError):
    """Training went wrong (a NaN loss, say)."""


class CheckpointError(RunError):
    """No usable checkpoint where one was expected."""


def in_your_files(places: Iterable[tuple[Path, int | None]]) -> list[str]:
    """`file:line` of each place (a file and a line) that is in one of your files of this package, in order."""
    package = Path(__file__).parents[1]  # src/PKG: your files and train.py
    return [f"{path.name}:{line}" for path, line in places if path.parent == package and path.name in USER_FILES]


def user_code_error(error: Exception, doing: str) -> RunError:
    """One line for an exception raised in your code: the file and line of yours it came from.

    A DataLoader worker's error arrives as text, with the worker's traceback in its message.
    Errors that did not pass through a user file are the template's: they keep their traceback.
    """
    text = str(error).strip()
    if isinstance(error, RunError) and "\n" in text:  # a DataLoader worker's error, with its traceback
        return type(error)(text.splitlines()[-1].split("Error: ", 1)[-1])
    if any(sign in text for sign in COLLECTIVE_FAILURES):  # another rank died or hangs: not this batch's fault
        raise error
    if "Expected to have finished reduction in the prior iteration" in text:  # DistributedDataParallel's check
        return StepError(
            "some trainable weights got no gradient in the last update (a head or layer the loss does not use); DDP "
            "needs every trained weight in every update: freeze unused ones with requires_grad_(False) in model.py"
        )
    if type(error).__name__ == "OutOfMemoryError":
        return StepError(f"out of memory {doing}; lower --global-batch-size or raise --grad-accum-steps")
    places = [(Path(frame.filename), frame.lineno) for frame in traceback.extract_tb(error.__traceback__)]
    places += [(Path(name), int(line)) for name, line in re.findall(r'File "([^"]+)", line (\d+)', text)]
    mine = in_your_files(places)
    if isinstance(error, RunError):  # one of ours, raised on a value your code passed: say where
        return type(error)(f"{mine[-1]}: {text}") if mine else error
    if not mine:
        raise error
    lines = [line for line in text.splitlines() if line.strip()]
    message = lines[-1].strip() if lines else type(error).__name__
    if not message.startswith(type(error).__name__):
        message = f"{type(error).__name__}: {message}"
    return StepError(f"{mine[-1]} failed {doing}: {message}")


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


def explain_failure(error: BaseException) -> str | None:
    """Say what a failed collective usually means; None for errors that are not about other ranks."""
    text = str(error)
    timeouts = ("Timed out", "timed out", "Watchdog caught collective operation timeout", "Application timeout")
    if any(timeout in text for timeout in timeouts):  # the last: gloo's, when a collective in flight timed out
        return (
            "a collective timed out: another rank is stuck (a hang in data loading, or a collective it never "
            "reached) or far slower; check every rank's log, or raise --dist-timeout-s for slow steps"
        )
    if "Connection closed by peer" in text or "Connection reset by peer" in text:
        return "another rank died; its own log says why (look for the first error above)"
    return None


def several_models_hint(models: object) -> str:
    """in_your_code's hint for build_optimizer, when model.py returns a dict of models ("" otherwise)."""
    if not isinstance(models, dict):
        return ""
    names = ", ".join(map(repr, models))
    return (
        f"model.py returns a dict of models, so build_optimizer receives the dict of those it trains ({names}): "
        f"optimize model[{next(iter(models))!r}].parameters(), say, or return a dict of optimizers"
    )


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
