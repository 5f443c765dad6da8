"""Shared helpers: render projects through the CLI and run commands with hard timeouts."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from looptpl.cli import app

REPO_ROOT = Path(__file__).resolve().parents[1]


def looptpl(*args: str) -> "CliResult":
    """Run the CLI in-process with stdin that is not a terminal (so nothing is asked)."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


class CliResult:
    def __init__(self, exit_code: int, stdout: str, stderr: str) -> None:
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr


def run(
    command: list[str], cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run a command to completion; kill its whole process group if it outlives `timeout`."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{' '.join(command)} did not finish within {timeout}s:\n{output[-5000:]}")
    return subprocess.CompletedProcess(command, process.returncode, output)


def answers(project: Path) -> dict:
    return yaml.safe_load((project / ".copier-answers.yml").read_text())


def python() -> str:
    return sys.executable
