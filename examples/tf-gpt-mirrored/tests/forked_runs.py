"""Training runs that start in a fraction of a second: forked from one process that imported the framework once.

A test run is a whole `python -m PKG.train` process: exit codes, signals, output and files as a user
sees them. Most of its start is importing the framework (2 to 4 s for torch, 6 to 9 s for TensorFlow),
which the suite's tens of runs would each repeat. So one server process imports it once, and each
run is a fork of that process that then runs the command's module as `python -m` would: in a new
process session (a signal to its group reaches it and what it starts), with the run's environment,
working directory and `sys.path`, its output in the run's log file, and the normal interpreter exit
(atexit handlers, thread joins, output flushed). Your package is imported in each run, never in the
server, so a run sees the files (or the edited copy of src/) it was started with. One difference
from a new process remains: the runs share the server's seed for hashing strings, so a set of
strings iterates in the same order in each of them.

`start(command, log, environment, preload)` returns a handle with the `subprocess.Popen` methods the
tests use (pid, poll, wait, returncode, send_signal). A run of several ranks (or workers) is several
such runs, each given its rank's environment. torchrun (`python -m torch.distributed.run`), for the
tests of what it does itself, is forked the same way: its agent starts with torch imported, and starts
each rank as a new process. A command that is not `python -m MODULE ...` (a launcher script) is started
as a real subprocess by the caller.
"""

import contextlib
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class ForkedRun:
    """A run forked by the server: the parts of `subprocess.Popen` that the tests use."""

    def __init__(self, server: "Server", pid: int, args: list[str]) -> None:
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self.server.ended.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        server = self.server
        with server.changed:
            if not server.changed.wait_for(lambda: self.pid in server.ended or not server.alive(), timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        if self.poll() is None:
            raise RuntimeError(
                f"the forked-runs server ended (exit code {server.process.returncode}) before run {self.pid}"
            )
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signal_number: int) -> None:
        os.kill(self.pid, signal_number)


class Server:
    """The test process's end: one request line per run, answered with the run's pid, then its exit code."""

    def __init__(self, preload: tuple[str, ...], environment: dict[str, str]) -> None:
        command = [sys.executable, __file__, *preload]
        environment = {name: value for name, value in environment.items() if name != "PYTHONPATH"}  # each run's own
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
        )
        self.started: list[int] = []
        self.ended: dict[int, int] = {}
        self.changed = threading.Condition()
        self.requests = threading.Lock()
        threading.Thread(target=self._read_answers, daemon=True).start()

    def start(self, command: list[str], log: Path, environment: dict[str, str], cwd: Path) -> ForkedRun:
        request = {"module": command[2], "argv": command[3:], "log": str(log), "cwd": str(cwd), "env": environment}
        with self.requests, self.changed:
            count = len(self.started)
            self.process.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
            self.process.stdin.flush()  # type: ignore[union-attr]
            if not self.changed.wait_for(lambda: len(self.started) > count or not self.alive(), 300):
                raise RuntimeError("the forked-runs server did not answer within 300 s")
            if len(self.started) == count:
                raise RuntimeError(f"the forked-runs server ended with exit code {self.process.returncode}")
            return ForkedRun(self, self.started[count], command)

    def alive(self) -> bool:
        return self.process.poll() is None

    def _read_answers(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            answer = json.loads(line)
            with self.changed:
                if "started" in answer:
                    self.started.append(answer["started"])
                else:
                    self.ended[answer["pid"]] = answer["returncode"]
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()


SERVERS: dict[tuple[object, ...], Server] = {}
SERVERS_LOCK = threading.Lock()  # tests may start runs from several threads at once
# Variables the frameworks read once, when they are imported: a run whose environment sets them otherwise than
# the server's (a test turning oneDNN off, say) is forked from a server started with its values.
READ_AT_IMPORT = ("TF_ENABLE_ONEDNN_OPTS", "TF_XLA_FLAGS", "XLA_FLAGS", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def start(
    command: list[str], log: Path, environment: dict[str, str], preload: tuple[str, ...], cwd: Path | None = None
) -> ForkedRun:
    """Run `command` (`python -m MODULE ...`) in `cwd` (this one by default), forked from a server that
    imported the modules `preload` (the framework, never your package), its output appended to `log`."""
    key = (preload, *(environment.get(name) for name in READ_AT_IMPORT))
    with SERVERS_LOCK:
        if key not in SERVERS or not SERVERS[key].alive():
            SERVERS[key] = Server(preload, environment)
        server = SERVERS[key]
    return server.start(command, log, environment, cwd or Path.cwd())


def wait_all(processes: Sequence["ForkedRun | subprocess.Popen"], deadline: float) -> int | None:
    """Wait for a run's processes (its ranks or workers) until `deadline`, a time.monotonic() value.
    Returns the exit code of the first that failed (0 if none did); or None if one outlived the deadline,
    once every process group still running is killed."""
    try:
        for process in processes:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        signal_groups(processes, signal.SIGKILL)
        for process in processes:
            process.wait()
        return None
    return next((process.returncode for process in processes if process.returncode), 0)


def signal_groups(processes: Sequence["ForkedRun | subprocess.Popen"], signal_number: int) -> None:
    """Send a signal to each process still running and to all it started (its process group), as a
    terminal's Ctrl-C reaches them. (An ended one's number may belong to another process by now.)"""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it may end between poll() and killpg()
                os.killpg(process.pid, signal_number)


def free_port() -> int:
    """A port that nothing uses right now, drawn at random below the range the system hands out itself,
    for a run's rank 0 to listen on.

    A port the system picked (bind to port 0) goes back to its pool once the probe closes, and a
    connection another run opens meanwhile may take it before rank 0 listens there; ports below that
    range are never handed out, and drawing them at random keeps runs started together apart.
    """
    try:
        lowest = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lowest = 32768
    while True:
        port = random.SystemRandom().randrange(10000, max(lowest, 10001))
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def serve() -> dict[str, Any]:
    """The server: fork a child per request and report it; return the request in the child, which runs it."""
    answers = sys.stdout
    running: set[int] = set()
    while True:
        # One request at a time (the test process waits for each answer), so a readable stdin holds one line.
        readable, _, _ = select.select([sys.stdin], [], [], 0.05)
        while running:  # report the runs that ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            print(json.dumps({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}), file=answers, flush=True)
        if not readable:
            continue
        line = sys.stdin.readline()
        if not line:  # the test process ended
            sys.exit(0)
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return request
        running.add(pid)
        print(json.dumps({"started": pid}), file=answers, flush=True)


def become(request: dict[str, Any]) -> None:
    """In a forked child: take on the run's session, output, environment, directory and path, as a new process would."""
    os.setsid()
    output = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.close(nothing)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    paths = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:1] = [request["cwd"], *paths]  # as `python -m` sets it: the directory, then PYTHONPATH
    sys.argv = [request["module"], *request["argv"]]


if __name__ == "__main__":
    for module in sys.argv[1:]:  # the framework, once: every fork starts with it imported
        __import__(module)
    # The framework's threads are idle pools: the forks start without them, as DataLoader workers do.
    warnings.filterwarnings("ignore", message="This process .* is multi-threaded", category=DeprecationWarning)
    sys.stdin = os.fdopen(0, "r", buffering=1)
    run = serve()
    become(run)
    import runpy

    runpy.run_module(run["module"], run_name="__main__", alter_sys=True)
