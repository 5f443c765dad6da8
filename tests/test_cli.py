"""The CLI through Typer's CliRunner and as real subprocesses: success paths and every bad input."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import answers, looptpl, run

from looptpl import __version__
from looptpl.variants import VARIANTS


def test_version():
    result = looptpl("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"looptpl {__version__}"


@pytest.mark.parametrize("command", [[], ["new"], ["list"]])
def test_help_on_every_command(command):
    result = looptpl(*command, "--help")
    assert result.exit_code == 0
    assert "Usage" in result.stdout


def test_list_shows_every_variant_with_its_launch_command():
    result = looptpl("list")
    assert result.exit_code == 0
    for variant in VARIANTS:
        assert variant.strategy in result.stdout
    assert "torchrun" in result.stdout


def test_new_renders_a_git_project_and_says_what_to_run(tmp_path):
    destination = tmp_path / "my-proj"
    result = looptpl("new", str(destination), "--backend", "torch", "--strategy", "ddp")
    assert result.exit_code == 0, result.stderr
    assert "torchrun --standalone --nproc-per-node 2 -m my_proj.train" in result.stdout
    assert (destination / "src" / "my_proj" / "engine.py").is_file()
    assert answers(destination)["strategy"] == "ddp"
    assert answers(destination)["package_name"] == "my_proj"
    log = subprocess.run(["git", "log", "--oneline"], cwd=destination, capture_output=True, text=True, check=True)
    assert len(log.stdout.splitlines()) == 1
    status = subprocess.run(["git", "status", "--porcelain"], cwd=destination, capture_output=True, text=True)
    assert status.stdout == ""  # everything generated is committed


def test_new_without_git_and_with_name_and_data(tmp_path):
    destination = tmp_path / "folder"
    result = looptpl(
        "new", str(destination), "--backend", "torch", "--strategy", "single", "--name", "vision-net", "--no-git",
        "--data", "description=Classifies images",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert not (destination / ".git").exists()
    assert (destination / "src" / "vision_net" / "train.py").is_file()
    assert "Classifies images" in (destination / "README.md").read_text()


def test_dry_run_writes_nothing(tmp_path):
    destination = tmp_path / "proj"
    result = looptpl("new", str(destination), "--backend", "torch", "--strategy", "single", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "src/proj/engine.py" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_no_terminal_means_defaults_and_no_waiting(tmp_path):
    # A real subprocess whose stdin is not a terminal: nothing is asked, defaults are used.
    result = run([sys.executable, "-m", "looptpl", "new", str(tmp_path / "plain")], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout
    assert answers(tmp_path / "plain")["strategy"] == "single"


def test_help_as_a_subprocess():
    result = subprocess.run(["looptpl", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "new" in result.stdout and "list" in result.stdout


def test_paths_with_spaces_and_non_ascii_characters(tmp_path):
    destination = tmp_path / "dossier été" / "new project"
    result = looptpl("new", str(destination), "--name", "projet", "--no-git")
    assert result.exit_code == 0, result.stderr
    assert (destination / "src" / "projet" / "train.py").is_file()


BAD_INPUTS = {
    "unknown backend": (["--backend", "jax"], "--backend jax is not supported"),
    "foreign strategy": (
        ["--backend", "torch", "--strategy", "mirrored"],
        "--strategy mirrored is a tensorflow strategy",
    ),
    "unknown strategy": (["--backend", "torch", "--strategy", "zero3"], "--strategy zero3 is not a known strategy"),
    "name not an identifier": (["--name", "9lives"], "is not a valid project name"),
    "name with a path": (["--name", "../escape"], "is not a valid project name"),
    "keyword name": (["--name", "class"], "is a Python keyword"),
    "stdlib name": (["--name", "json"], "would shadow the module 'json'"),
    "ML module name": (["--name", "torch"], "would shadow the module 'torch'"),
    "test name": (["--name", "test"], "would shadow the module 'test'"),
    "bad data": (["--data", "color=blue"], "--data 'color=blue' must be KEY=VALUE"),
    "bad package in data": (["--data", "package_name=My-Pkg"], "is not a valid Python identifier"),
}


@pytest.mark.parametrize("flags, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_one_clear_line_and_writes_nothing(tmp_path, flags, message):
    result = looptpl("new", str(tmp_path / "proj"), *flags)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
    assert list(tmp_path.iterdir()) == []


def test_folder_name_that_is_not_a_project_name_asks_for_name(tmp_path):
    result = looptpl("new", str(tmp_path / "my project"))
    assert result.exit_code == 2
    assert "pass --name" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_non_empty_destination_is_left_untouched(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "notes.txt").write_text("mine")
    result = looptpl("new", str(tmp_path / "proj"))
    assert result.exit_code == 2
    assert "already exists and is not empty" in result.stderr
    assert [path.name for path in (tmp_path / "proj").iterdir()] == ["notes.txt"]


def test_empty_destination_folder_is_used(tmp_path):
    (tmp_path / "proj").mkdir()
    assert looptpl("new", str(tmp_path / "proj"), "--no-git").exit_code == 0
    assert (tmp_path / "proj" / "src" / "proj" / "train.py").is_file()


def test_destination_inside_a_file_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("")
    result = looptpl("new", str(tmp_path / "a-file" / "proj"))
    assert result.exit_code == 2
    assert "cannot write to" in result.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_unwritable_destination_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    result = looptpl("new", str(locked / "proj"))
    assert result.exit_code == 2
    assert "cannot write to" in result.stderr
    assert list(locked.iterdir()) == []


def test_a_failure_after_rendering_leaves_nothing_behind(tmp_path, monkeypatch):
    from looptpl import render
    from looptpl.errors import LooptplError

    def broken_git(project: Path) -> None:
        raise LooptplError("git exploded", exit_code=1)

    monkeypatch.setattr(render, "_git_init_and_commit", broken_git)
    result = looptpl("new", str(tmp_path / "proj"))
    assert result.exit_code == 1
    assert "git exploded" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_input_as_a_subprocess_has_no_traceback(tmp_path):
    result = run([sys.executable, "-m", "looptpl", "new", str(tmp_path / "p"), "--backend", "jax"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout.strip() == "error: --backend jax is not supported; choose one of: torch, tensorflow"


def test_todo_lists_what_is_left_and_fails_until_done(tmp_path):
    project = tmp_path / "proj"
    assert looptpl("new", str(project), "--no-git").exit_code == 0
    result = looptpl("todo", str(project))
    assert result.exit_code == 1
    listed = result.stdout.splitlines()
    assert any(line.startswith("src/proj/data.py:") and "load your data" in line for line in listed)
    assert {line.split(":")[0] for line in listed} == {
        f"src/proj/{name}.py" for name in ("data", "model", "loss", "metrics", "optim")
    }
    for path in (project / "src" / "proj").glob("*.py"):
        path.write_text(path.read_text().replace("# TODO(", "# Done("))
    result = looptpl("todo", str(project))
    assert result.exit_code == 0
    assert "No TODOs left." in result.stdout


def test_todo_outside_a_project_is_a_clear_error(tmp_path):
    result = looptpl("todo", str(tmp_path))
    assert result.exit_code == 2
    assert "is not a looptpl project" in result.stderr
