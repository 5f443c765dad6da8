"""Ctrl-C and SIGTERM cancel a command the same way: cleanup runs, then one line and exit 130 or 143.

Both raise Cancelled, so `finally` blocks and context managers remove what a command had started to
write: SIGTERM (a `kill`, a CI timeout, a closing container) would otherwise end the process on the
spot and leave a half-rendered staging folder and copier's temporary clone behind. A second signal
during that cleanup is ignored, so the cleanup finishes. Inside `deferred()` the cancellation waits
for the block's end: a step that makes a folder and notes it for the cleanup must not be cut in two.
A signal that lands where Python cannot raise (a weakref callback or `__del__`, such as importlib's module
locks run while a module imports) is sent again, so it cancels the command instead of being printed as
"Exception ignored" and lost.
After `finished()` (the command's work is in place) a signal cancels nothing. Without install()
(looptpl used as a library, or in tests) Ctrl-C stays Python's KeyboardInterrupt, which the CLI
reports the same way, and neither holds it back.
"""

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

exit_code = 130  # 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM
cancelled = False  # set by a signal: whatever exception follows (Python 3.11 wraps one raised in `__set_name__`
# while a module imports into a RuntimeError, say) is the cancellation, not a failure to report
MESSAGE = "cancelled; nothing was written"
_deferring = False  # inside deferred(): a signal only marks the command cancelled
_finished = False  # after finished(): the command's work is done and kept, a signal changes nothing


class Cancelled(BaseException):
    """Ctrl-C or SIGTERM. Not a KeyboardInterrupt, which Typer and Click would turn into a silent exit."""


def _cancel(signum: int, frame: FrameType | None) -> None:
    global exit_code, cancelled
    if _finished:
        return
    exit_code, cancelled = 128 + signum, True
    for each in (signal.SIGINT, signal.SIGTERM):
        signal.signal(each, signal.SIG_IGN)
    if not _deferring:
        raise Cancelled


def _unraisable(report: "sys.UnraisableHookArgs") -> None:
    """Python swallowed a Cancelled (raised in a weakref callback or `__del__`): cancel again, 10 ms later.

    An alarm brings it back at a later line of the command, outside the callback (were that line in a
    callback too, this runs again). Sending the signal from here would run the handler inside this hook.
    """
    if report.exc_type is not Cancelled:
        sys.__unraisablehook__(report)
    elif not _finished and hasattr(signal, "setitimer"):  # Windows has no alarms
        signal.signal(signal.SIGALRM, _cancel_again)
        signal.setitimer(signal.ITIMER_REAL, 0.01)


def _cancel_again(signum: int, frame: FrameType | None) -> None:
    if not (_finished or _deferring):
        raise Cancelled


@contextmanager
def deferred() -> Iterator[None]:
    """Hold a Ctrl-C or SIGTERM until the block ends, then cancel: for `mkdir` and noting the folder made.

    Not nested: the blocks are a few lines each. A block that fails after a signal came reports the
    cancellation, not its own error (a full disk, say), as the module's other paths do.
    """
    global _deferring
    _deferring = True
    try:
        yield
    except BaseException:
        if cancelled:
            raise Cancelled from None
        raise
    finally:
        _deferring = False
    if cancelled:
        raise Cancelled


def finished() -> None:
    """The command's work is in place: a signal from now on is not a cancellation (it would say nothing was written)."""
    global _finished
    _finished = True


def wait_for_children(seconds: float = 30.0) -> None:
    """After a cancellation, wait (at most `seconds`) until the processes this one started have exited.

    A Ctrl-C or SIGTERM reaches looptpl alone, not the git that copier had started: that git goes on,
    and would write into a folder the cleanup removed (recreating it) or into a project an update
    just put back. Without a cancellation this does nothing: it reaps any child of the process, so
    it must not run beside a library caller's own processes.
    """
    if not cancelled or not hasattr(os, "WNOHANG"):  # Windows has no waitpid(-1)
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if pid == 0:  # some still run
            time.sleep(0.02)


def install() -> None:
    """Make SIGINT and SIGTERM raise Cancelled (call it first thing, from the entry point only)."""
    global exit_code, cancelled, _deferring, _finished
    exit_code, cancelled, _deferring, _finished = 130, False, False, False
    for each in (signal.SIGINT, signal.SIGTERM):
        signal.signal(each, _cancel)
    sys.unraisablehook = _unraisable


def ignore() -> None:
    """From now on SIGINT and SIGTERM do nothing (the command has ended; the process is exiting)."""
    for each in (signal.SIGINT, signal.SIGTERM):
        signal.signal(each, signal.SIG_IGN)


def report() -> None:
    """Print the cancellation and exit with its status (for a signal that came before a command ran)."""
    print(f"error: {MESSAGE}", file=sys.stderr)
    sys.exit(exit_code)
