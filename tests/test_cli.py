"""The CLI through Typer's CliRunner and as real subprocesses: success paths and every bad input."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
import yaml
from conftest import REPO_ROOT, answers, looptpl, run, user_files

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
    assert (destination / "src" / "my_proj" / "train.py").is_file()
    assert answers(destination)["strategy"] == "ddp"
    assert answers(destination)["package_name"] == "my_proj"
    log = subprocess.run(["git", "log", "--oneline"], cwd=destination, capture_output=True, text=True, check=True)
    assert len(log.stdout.splitlines()) == 1
    status = subprocess.run(["git", "status", "--porcelain"], cwd=destination, capture_output=True, text=True)
    assert status.stdout == ""  # everything generated is committed


def test_new_without_git_or_ci_and_with_name_and_data(tmp_path):
    destination = tmp_path / "folder"
    result = looptpl(
        "new", str(destination), "--backend", "torch", "--strategy", "single", "--name", "vision-net", "--no-git",
        "--no-ci", "--data", "description=Classifies images",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert not (destination / ".git").exists()
    assert (destination / "src" / "vision_net" / "train.py").is_file()
    assert "Classifies images" in (destination / "README.md").read_text()
    # --no-ci: no workflow, no pre-commit config, no word of them in the README; the answer is kept for updates.
    assert not (destination / ".github").exists() and not (destination / ".pre-commit-config.yaml").exists()
    assert "ci.yml" not in (destination / "README.md").read_text()
    assert answers(destination)["ci"] is False


def test_dry_run_writes_nothing(tmp_path):
    destination = tmp_path / "proj"
    result = looptpl("new", str(destination), "--backend", "torch", "--strategy", "single", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "src/proj/train.py" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_no_terminal_and_no_backend_is_one_line_naming_the_flags(tmp_path):
    # A real subprocess whose stdin is not a terminal: nobody can answer, so nothing waits for an answer.
    result = run([sys.executable, "-m", "looptpl", "new", str(tmp_path / "plain")], cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stdout.startswith("error: --backend and --strategy are missing and there is no terminal to ask in")
    assert "--defaults" in result.stdout and len(result.stdout.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_no_terminal_and_no_strategy_names_the_backends_strategies(tmp_path):
    result = looptpl("new", str(tmp_path / "proj"), "--backend", "tensorflow")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --strategy is missing and there is no terminal to ask in; with --backend tensorflow pass one of: "
        "one-device, mirrored, multi-worker, or --defaults for one-device"
    )


def test_defaults_without_a_terminal(tmp_path):
    result = run([sys.executable, "-m", "looptpl", "new", "plain", "--defaults"], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout
    assert answers(tmp_path / "plain")["backend"] == "torch" and answers(tmp_path / "plain")["strategy"] == "single"


def test_a_strategy_implies_its_backend(tmp_path):
    result = looptpl("new", str(tmp_path / "proj"), "--strategy", "mirrored", "--no-git")
    assert result.exit_code == 0, result.stderr
    assert answers(tmp_path / "proj")["backend"] == "tensorflow"


def test_help_as_a_subprocess():
    result = subprocess.run(["looptpl", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "new" in result.stdout and "list" in result.stdout


def test_paths_with_spaces_and_non_ascii_characters(tmp_path):
    destination = tmp_path / "dossier été" / "new project"
    result = looptpl("new", str(destination), "--name", "projet", "--no-git", "--defaults")
    assert result.exit_code == 0, result.stderr
    assert (destination / "src" / "projet" / "train.py").is_file()


BAD_INPUTS = {
    "unknown backend": (["--backend", "mxnet"], "--backend mxnet is not supported"),
    "foreign strategy": (
        ["--backend", "torch", "--strategy", "mirrored"],
        "--strategy mirrored is a tensorflow strategy",
    ),
    "unknown strategy": (["--backend", "torch", "--strategy", "zero3"], "--strategy zero3 is not a known strategy"),
    "unknown strategy alone": (["--strategy", "zero3"], "choose one of: single, ddp, fsdp, one-device, mirrored"),
    "description breaking pyproject": (["--data", 'description=say "hi"'], "without double quotes, backslashes"),
    "description with a control character": (["--data", "description=a\x01b"], "or control characters"),
    "project name pyproject rejects": (["--name", "proj-"], "end with a letter or digit"),
    "300-character name": (["--name", "a" * 300], "the project name is 300 characters long; use at most 100"),
    "dunder package": (["--data", "package_name=__main__"], "start with a lowercase letter"),
    "a dependency of torch": (["--name", "sympy"], "would shadow the module 'sympy'"),
    "a dependency of TensorFlow": (["--strategy", "mirrored", "--name", "google"], "would shadow the module 'google'"),
    "absl": (["--strategy", "mirrored", "--name", "absl"], "would shadow the module 'absl'"),
    "a module of the project": (["--name", "model"], "would shadow the module 'model'"),
    # --tracker wandb / mlflow import these in the training process (see test_no_package_name_shadows_what_...).
    "the wandb tracker": (["--name", "wandb"], "would shadow the module 'wandb', which --tracker wandb imports;"),
    "the mlflow tracker": (["--name", "mlflow"], "would shadow the module 'mlflow', which --tracker mlflow imports;"),
    "what both trackers import": (
        ["--name", "pydantic"],
        "package name 'pydantic' would shadow the module 'pydantic', which --tracker wandb and --tracker mlflow "
        "import; choose another, e.g. pydantic_project",
    ),
    "what a tracker imports, as --data": (["--data", "package_name=sqlalchemy"], "--data package_name: package name"),
    "--data backend against --backend": (
        ["--data", "backend=tensorflow", "--backend", "torch"],
        "--backend torch and --data backend=tensorflow disagree; pass only one of them",
    ),
    "--data strategy against --strategy": (["--data", "strategy=ddp", "--strategy", "fsdp"], "disagree"),
    "name not an identifier": (["--name", "9lives"], "is not a valid project name"),
    "name with a path": (["--name", "../escape"], "is not a valid project name"),
    "keyword name": (["--name", "class"], "is a Python keyword"),
    "stdlib name": (["--name", "json"], "would shadow the module 'json'"),
    "ML module name": (["--name", "torch"], "would shadow the module 'torch'"),
    "test name": (["--name", "test"], "would shadow the module 'test'"),
    "bad data": (["--data", "color=blue"], "--data 'color=blue' must be KEY=VALUE"),
    "bad package in data": (["--data", "package_name=My-Pkg"], "is not a valid Python identifier"),
}


def test_every_name_copier_refuses_is_refused_first():
    """copier.yml's validator refuses some package names with a traceback; looptpl must refuse them first."""
    from looptpl.validation import package_name_problem

    validator = yaml.safe_load((REPO_ROOT / "copier.yml").read_text())["package_name"]["validator"]
    names = re.findall(r"'([a-z_]+)'", validator.split("package_name in [")[1].split("]")[0])
    assert "model" in names and "data" in names
    assert [name for name in names if package_name_problem(name) is None] == []


def test_copier_yml_offers_exactly_the_variants_looptpl_knows():
    """Plain copier users answer copier.yml's questions: its choices, validator and default must follow variants.py."""
    from looptpl.variants import BACKENDS, VARIANTS, strategies

    questions = yaml.safe_load((REPO_ROOT / "copier.yml").read_text())
    assert list(questions["backend"]["choices"].values()) == list(BACKENDS)
    # Each strategy name once (JAX's single is torch's name), in variants.py's order of first appearance.
    assert list(questions["strategy"]["choices"].values()) == list(dict.fromkeys(v.strategy for v in VARIANTS))
    validator = questions["strategy"]["validator"]
    for backend, listed in zip(BACKENDS, re.findall(r"_strategies = \[(.*?)\]", validator), strict=True):
        assert re.findall(r"'([a-z-]+)'", listed) == strategies(backend)
    # "{{ {'torch': 'single', ...}[backend] }}": each backend's first strategy.
    defaults = dict(re.findall(r"'([a-z]+)': '([a-z-]+)'", questions["strategy"]["default"]))
    assert defaults == {backend: strategies(backend)[0] for backend in BACKENDS}


def installed_modules(distribution: str) -> set[str]:
    """The top-level modules a distribution and its dependencies (no extras) install, as the project imports them."""
    from importlib import metadata

    from packaging.requirements import Requirement

    modules: set[str] = set()
    seen: set[str] = set()
    pending = [distribution]
    while pending:
        name = pending.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            found = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for file in found.files or []:
            top = file.parts[0]
            package_or_module = len(file.parts) > 1 or top.endswith(".py")
            if package_or_module and not top.endswith((".dist-info", ".data")) and top != "..":
                modules.add(top.removesuffix(".py"))
        for requirement in map(Requirement, found.requires or []):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):  # what installs here
                pending.append(requirement.name)
    return {module for module in modules if re.fullmatch(r"[a-z][a-z0-9_]*", module)}


@pytest.mark.parametrize("framework", ["torch", "tensorflow-cpu", "jax", "flax", "optax", "orbax-checkpoint", "pytest"])
def test_no_package_name_shadows_what_the_framework_installs(framework):
    """Checked against what is installed here: a package named like any of these would be imported in its place."""
    from looptpl.validation import package_name_problem

    modules = installed_modules(framework)
    if not modules:
        pytest.skip(f"{framework} is not installed")
    assert sorted(module for module in modules if package_name_problem(module) is None) == []


# What opening a tracker imports, printed as JSON: the run's top-level modules that Python itself does not have.
TRACKER_RUN = """
import json, sys, tempfile
from pathlib import Path
before = set(sys.modules)
from probe.trackers import open_tracker
with tempfile.TemporaryDirectory() as run_dir:
    tracker = open_tracker(sys.argv[1], Path(run_dir), "probe", {"lr": 0.1})
    tracker.log({"train_loss": 1.0}, step=1)
    tracker.close({"test_loss": 1.0, "steps": 1})
names = {name.partition(".")[0] for name in set(sys.modules) - before}
print(json.dumps(sorted(name for name in names if name not in sys.stdlib_module_names and name != "probe")))
"""


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_no_package_name_shadows_what_a_tracker_imports(tmp_path, tracker):
    """A run with --tracker X imports these (measured offline, MLflow on its default SQLite store): a package of
    one of their names and the installed module would be one name on sys.path, so the run could not import both."""
    from importlib.util import find_spec

    from looptpl.validation import package_name_problem

    if find_spec(tracker) is None:
        pytest.skip(f"{tracker} is not installed")
    rendered = looptpl("new", str(tmp_path / "rendered"), "--backend", "torch", "--strategy", "single", "--no-git")
    assert rendered.exit_code == 0, rendered.stderr
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "__init__.py").write_text("")
    for name in ("trackers.py", "errors.py"):  # the project's own, as rendered
        shutil.copy(tmp_path / "rendered" / "src" / "rendered" / "kit" / name, probe / name)
    environment = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}  # SQLite
    environment.update(WANDB_MODE="offline", WANDB_SILENT="true")
    for folder in ("CONFIG", "CACHE", "DATA"):  # nothing written outside tmp_path
        environment[f"WANDB_{folder}_DIR"] = str(tmp_path / f"wandb-{folder.lower()}")
    result = subprocess.run(
        [sys.executable, "-c", TRACKER_RUN, tracker],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert tracker in imported
    assert [name for name in imported if package_name_problem(name) is None] == []
    assert f"--tracker {tracker}" in (package_name_problem(tracker) or "")


def test_rename_to_what_a_tracker_imports_is_refused_and_changes_nothing(tmp_path):
    project = tmp_path / "proj"
    assert looptpl("new", str(project), "--defaults", "--no-git").exit_code == 0
    before = {path: path.read_bytes() for path in project.rglob("*") if path.is_file()}
    result = looptpl("rename", "mlflow", str(project))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: package name 'mlflow' would shadow the module 'mlflow', which --tracker mlflow imports; choose "
        "another, e.g. mlflow_project (looptpl rename NEW_NAME)"
    )
    assert {path: path.read_bytes() for path in project.rglob("*") if path.is_file()} == before


@pytest.mark.parametrize("flags, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_one_clear_line_and_writes_nothing(tmp_path, flags, message):
    result = looptpl("new", str(tmp_path / "proj"), *flags)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
    assert list(tmp_path.iterdir()) == []


def test_folder_name_that_is_not_a_project_name_asks_for_name(tmp_path):
    result = looptpl("new", str(tmp_path / "my project"), "--defaults")
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
    assert looptpl("new", str(tmp_path / "proj"), "--no-git", "--defaults").exit_code == 0
    assert (tmp_path / "proj" / "src" / "proj" / "train.py").is_file()


def test_destination_inside_a_file_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("")
    result = looptpl("new", str(tmp_path / "a-file" / "proj"))
    assert result.exit_code == 2
    assert "cannot write to" in result.stderr


def test_a_destination_inside_the_development_checkout_is_refused():
    # Copier reads a checkout's template through git; a project inside it failed with "None" for a reason.
    destination = REPO_ROOT / "bench" / "not-a-project"
    result = looptpl("new", str(destination), "--defaults", "--no-git")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert "inside the looptpl checkout" in result.stderr and "choose a folder outside it" in result.stderr
    assert not destination.exists()


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
    result = looptpl("new", str(tmp_path / "proj"), "--defaults")
    assert result.exit_code == 1
    assert "git exploded" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_input_as_a_subprocess_has_no_traceback(tmp_path):
    result = run([sys.executable, "-m", "looptpl", "new", str(tmp_path / "p"), "--backend", "mxnet"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout.strip() == "error: --backend mxnet is not supported; choose one of: torch, tensorflow, jax"


def test_todo_lists_what_is_left_and_fails_until_done(tmp_path):
    project = tmp_path / "proj"
    assert looptpl("new", str(project), "--no-git", "--defaults").exit_code == 0
    result = looptpl("todo", str(project))
    assert result.exit_code == 1
    listed = result.stdout.splitlines()
    # A TODO over two comment lines is listed whole, and the files come in the order to fill them in.
    assert any(line.startswith("src/proj/data.py:") and "uneven evaluation shards." in line for line in listed)
    assert listed[0].startswith("src/proj/data.py:") and listed[-1].startswith("src/proj/settings.py:")
    assert "fill them in this order: data.py, model.py, step.py, loss.py, metrics.py, optim.py, settings.py." in (
        result.stderr
    )
    assert {line.split(":")[0] for line in listed} == {
        f"src/proj/{name}.py" for name in ("data", "model", "step", "loss", "metrics", "optim", "settings")
    }
    for path in (project / "src" / "proj").glob("*.py"):
        path.write_text(path.read_text().replace("# TODO(", "# Done("))
    result = looptpl("todo", str(project))
    assert result.exit_code == 0
    assert "No TODOs left." in result.stdout


def test_new_without_dest_is_one_line_and_names_are_not_case_sensitive(tmp_path):
    result = looptpl("new", "--defaults")
    assert result.exit_code == 2
    assert (
        result.stderr.strip()
        == "error: looptpl new needs DEST, the folder to create the project in: looptpl new myproj"
    )
    result = looptpl("new", str(tmp_path / "proj"), "--backend", "Torch", "--strategy", "DDP", "--no-git", "--defaults")
    assert result.exit_code == 0, result.stderr
    assert (answers(tmp_path / "proj")["backend"], answers(tmp_path / "proj")["strategy"]) == ("torch", "ddp")


def test_help_is_plain_and_list_wraps_between_words():
    result = subprocess.run(
        ["looptpl", "--help"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"}
    )
    assert "<bool>" not in result.stdout  # no type after a flag
    assert "..." not in result.stdout.split("Commands:")[1]  # no summary cut short
    listing = subprocess.run(
        ["looptpl", "list"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"}
    )
    words = listing.stdout.split()
    assert "MultiWorkerMirroredStrategy:" in words and "PKG.kit.launch" in words
    assert max(map(len, listing.stdout.split("Examples")[0].splitlines())) <= 80  # the table; examples: a line each


def test_todo_outside_a_project_is_a_clear_error(tmp_path):
    result = looptpl("todo", str(tmp_path))
    assert result.exit_code == 2
    assert "is not a looptpl project" in result.stderr


# --- examples: `looptpl new DEST --example NAME` ----------------------------------------------------

EXAMPLES = REPO_ROOT / "examples"


def test_list_shows_every_example_with_its_variant_and_what_it_trains():
    result = looptpl("list")
    assert result.exit_code == 0
    lines = result.stdout.split("Examples")[1].splitlines()
    folders = sorted(path.name for path in EXAMPLES.iterdir() if (path / ".copier-answers.yml").is_file())
    assert folders and len(folders) == len(list(EXAMPLES.iterdir()))
    for folder in folders:
        variant = "{backend}/{strategy}".format(**answers(EXAMPLES / folder))
        line = next(line for line in lines if line.split()[:1] == [folder])
        assert variant in line and len(line.split(variant)[1].strip()) > 20  # the one-liner


def test_new_from_an_example_takes_its_files_renamed_and_commits_them(tmp_path):
    example = EXAMPLES / "torch-gan-ddp"
    destination = tmp_path / "mine"
    result = looptpl("new", str(destination), "--example", "torch-gan-ddp", "--name", "my-gan")
    assert result.exit_code == 0, result.stderr
    assert "Created" in result.stdout and "torchrun" in result.stdout
    recorded = answers(destination)
    assert (recorded["backend"], recorded["strategy"], recorded["package_name"]) == ("torch", "ddp", "my_gan")
    assert recorded["description"] == answers(example)["description"]
    theirs, ours = example / "src" / "gan_ddp", destination / "src" / "my_gan"
    names = user_files(theirs)
    assert names == {"data.py", "model.py", "loss.py", "metrics.py", "optim.py", "step.py", "settings.py", "hooks.py"}
    for name in names:
        text = (ours / name).read_text()
        assert text == (theirs / name).read_text().replace("gan_ddp", "my_gan"), name
        assert "gan_ddp" not in text
    for test_file in (example / "tests").glob("*.py"):  # its tests come too, about the new package
        expected = test_file.read_text().replace("gan_ddp", "my_gan")
        assert (destination / "tests" / test_file.name).read_text() == expected
    assert '"scikit-learn>=1.3"' in (destination / "pyproject.toml").read_text()  # the dependency its data needs
    assert not (ours / "__pycache__").exists()
    # All of it is the project's first commit, so `looptpl update` treats the example's files as the user's.
    git = ["git", "-C", str(destination)]
    assert len(subprocess.run([*git, "log", "--oneline"], capture_output=True, text=True).stdout.splitlines()) == 1
    assert subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout == ""
    todo = looptpl("todo", str(destination))
    assert todo.exit_code == 0 and "No TODOs left." in todo.stdout


def test_new_from_an_example_keeps_its_package_name_by_default_and_dry_runs(tmp_path):
    result = looptpl("new", str(tmp_path / "digits"), "--example", "torch-digits-ddp", "--defaults", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "src/digits/data.py" in result.stdout
    assert list(tmp_path.iterdir()) == []


EXAMPLE_MISTAKES = {
    "unknown example": (
        ["--example", "mnist"],
        "--example mnist is not an example; choose one of: jax-charlm-data-parallel, jax-digits-data-parallel, "
        "tf-charlm-mirrored",
    ),
    "conflicting strategy": (
        ["--example", "torch-gan-ddp", "--strategy", "fsdp"],
        "--strategy fsdp conflicts with --example torch-gan-ddp, a torch/ddp project; drop --strategy",
    ),
    "conflicting backend": (
        ["--example", "tf-digits-mirrored", "--backend", "torch"],
        "--backend torch conflicts with --example tf-digits-mirrored, a tensorflow/mirrored project",
    ),
}


@pytest.mark.parametrize("flags, message", EXAMPLE_MISTAKES.values(), ids=EXAMPLE_MISTAKES.keys())
def test_a_wrong_example_is_one_line_and_writes_nothing(tmp_path, flags, message):
    result = looptpl("new", str(tmp_path / "proj"), *flags)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
    assert list(tmp_path.iterdir()) == []


def test_an_example_that_names_its_package_outside_an_import_is_not_guessed(tmp_path):
    from looptpl.errors import LooptplError
    from looptpl.examples import Example, _rename_package

    example = Example("demo", tmp_path, {"backend": "torch", "strategy": "ddp", "package_name": "demo_pkg"})
    code = "from demo_pkg.config import TrainConfig\nimport demo_pkg.data as d\n"
    renamed = _rename_package(example, Path("src/demo_pkg/model.py"), code, "mine")
    assert renamed == "from mine.config import TrainConfig\nimport mine.data as d\n"
    with pytest.raises(LooptplError, match=r"src/demo_pkg/data.py:2 names its package 'demo_pkg' outside an import"):
        _rename_package(example, Path("src/demo_pkg/data.py"), 'x = 1\nPATH = "demo_pkg/file.csv"\n', "mine")


# --- a person at a terminal: questions, progress, shell completion -------------------------------


def terminal(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> pexpect.spawn:
    """`python -m looptpl ARGS` attached to a pseudo-terminal, as a person runs it."""
    # COLUMNS and LINES (pytest-xdist's workers set them) would override the terminal's own size.
    inherited = {name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")}
    environment = {**inherited, "TERM": "xterm", "LOOPTPL_HOME": str(cwd / "looptpl-home"), **(env or {})}
    return pexpect.spawn(
        sys.executable,
        ["-m", "looptpl", *args],
        cwd=str(cwd),
        env=environment,
        encoding="utf-8",
        timeout=120,
        dimensions=(24, 400),  # wide enough that no line wraps, a long temporary folder included
    )


def finish(child: pexpect.spawn) -> str:
    """Everything the program still prints, once it has exited."""
    child.expect(pexpect.EOF)
    child.close()
    return str(child.before)


def test_new_in_a_terminal_asks_each_question_and_uses_the_answers(tmp_path):
    child = terminal(["new", "my-folder"], tmp_path)
    child.expect_exact("Backend (torch, tensorflow, jax) [torch]: ")
    child.sendline("mxnet")
    child.expect_exact("Error: choose one of: torch, tensorflow, jax")  # asked again, not a crash
    child.expect_exact("Backend (torch, tensorflow, jax) [torch]: ")
    child.sendline("tensorflow")
    child.expect_exact("multi-worker  MultiWorkerMirroredStrategy")  # each strategy with when to use it
    child.expect_exact("Strategy (one-device, mirrored, multi-worker) [one-device]: ")  # the backend's only
    child.sendline("Mirrored")  # names are not case-sensitive
    child.expect_exact("Project name [my-folder]: ")
    child.sendline("json")
    child.expect_exact("Error: package name 'json' would shadow the module 'json'")
    child.expect_exact("Project name [my-folder]: ")
    child.sendline("vision-net")
    child.expect_exact("Description [A custom training loop generated by looptpl]: ")
    child.sendline("Classifies images")
    output = finish(child)
    assert child.exitstatus == 0, output
    assert "Created my-folder (tensorflow, mirrored)." in output
    project = tmp_path / "my-folder"
    assert {key: answers(project)[key] for key in ("backend", "strategy", "project_name", "package_name")} == {
        "backend": "tensorflow",
        "strategy": "mirrored",
        "project_name": "vision-net",
        "package_name": "vision_net",
    }
    assert "Classifies images" in (project / "README.md").read_text()
    assert (project / ".git").is_dir()


def test_new_in_a_terminal_takes_every_default_on_enter(tmp_path):
    child = terminal(["new"], tmp_path)  # no DEST: asked for first
    child.expect_exact("Folder for the project: ")
    child.sendline("proj")
    for question in ("Backend", "Strategy (single, ddp, fsdp) [single]", "Project name [proj]", "Description"):
        child.expect_exact(question)
        child.sendline("")
    output = finish(child)
    assert child.exitstatus == 0, output
    recorded = answers(tmp_path / "proj")
    assert (recorded["backend"], recorded["strategy"], recorded["project_name"]) == ("torch", "single", "proj")
    assert recorded["description"] == "A custom training loop generated by looptpl"  # copier.yml's default


def test_new_in_a_terminal_asks_only_what_the_flags_leave_out_and_can_be_cancelled(tmp_path):
    child = terminal(["new", "proj", "--backend", "torch", "--name", "net"], tmp_path)
    child.expect_exact("Strategy (single, ddp, fsdp) [single]: ")
    child.sendcontrol("c")
    output = finish(child)
    assert child.exitstatus == 130
    assert "error: cancelled; nothing was written" in output and "Backend" not in output
    assert not (tmp_path / "proj").exists()


def fake_install(site: Path) -> Path:
    """This checkout's looptpl laid out as a wheel installs it: the package with the template inside."""
    package = site / "looptpl"
    shutil.copytree(REPO_ROOT / "generator" / "looptpl", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "_template").mkdir()
    shutil.copy(REPO_ROOT / "copier.yml", package / "_template")
    shutil.copytree(REPO_ROOT / "templates", package / "_template" / "templates")
    caches = shutil.ignore_patterns("__pycache__", ".ruff_cache", ".mypy_cache", ".pytest_cache", "runs")
    shutil.copytree(REPO_ROOT / "examples", package / "_template" / "examples", ignore=caches)
    return site


def test_an_installed_looptpl_lists_and_renders_its_examples(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(fake_install(tmp_path / "site")), "LOOPTPL_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "looptpl"]
    listed = subprocess.run([*command, "list"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "torch-charlm-ddp" in listed.stdout, listed.stderr
    created = subprocess.run(
        [*command, "new", "lm", "--example", "torch-charlm-ddp", "--no-git"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    data = (tmp_path / "lm" / "src" / "lm" / "data.py").read_text()
    assert data == (EXAMPLES / "torch-charlm-ddp" / "src" / "charlm_ddp" / "data.py").read_text()


def test_storing_the_template_shows_progress_on_a_terminal_only(tmp_path):
    env = {"PYTHONPATH": str(fake_install(tmp_path / "site"))}
    child = terminal(["new", "first", "--defaults"], tmp_path, env)
    output = finish(child)
    assert child.exitstatus == 0, output
    assert f"Storing the template of looptpl {__version__} in {tmp_path / 'looptpl-home' / 'template'}" in output
    assert "Created first" in output
    child = terminal(["new", "second", "--defaults"], tmp_path, env)
    output = finish(child)
    assert child.exitstatus == 0 and "Storing" not in output  # stored once per version

    env["LOOPTPL_HOME"] = str(tmp_path / "another-home")  # stored again, but without a terminal: quiet
    command = [sys.executable, "-m", "looptpl", "new", "third", "--defaults"]
    result = subprocess.run(command, cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("Created third")


def complete(words: str, shell: str = "bash") -> list[str]:
    """What the shell completion script gets from looptpl for the command line `words` (cursor at its end)."""
    env = {**os.environ, "_LOOPTPL_COMPLETE": f"complete_{shell}"}
    if shell == "bash":
        env |= {"COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    else:
        env["_TYPER_COMPLETE_ARGS"] = words
    result = subprocess.run([sys.executable, "-m", "looptpl"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_completion_offers_backends_and_the_backends_strategies():
    assert complete("looptpl n") == ["new"]
    assert complete("looptpl new proj --backend ") == ["torch", "tensorflow", "jax"]
    assert complete("looptpl new proj --backend t") == ["torch", "tensorflow"]
    assert complete("looptpl new proj --backend torch --strategy ") == ["single", "ddp", "fsdp"]
    assert complete("looptpl new proj --backend tensorflow --strategy m") == ["mirrored", "multi-worker"]
    assert complete("looptpl new proj --strategy ") == list(dict.fromkeys(variant.strategy for variant in VARIANTS))
    assert complete("looptpl new proj --backend jax --strategy ") == ["single", "data-parallel", "fsdp"]
    zsh = "\n".join(complete("looptpl new proj --strategy d", shell="zsh"))
    assert '"ddp":"DistributedDataParallel\\\\: one process per GPU, one or many nodes"' in zsh


def test_completion_script_shows_and_installs(tmp_path):
    command = [sys.executable, "-m", "looptpl"]
    shown = subprocess.run([*command, "--show-completion", "bash"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "_LOOPTPL_COMPLETE=complete_bash" in shown.stdout
    env = {**os.environ, "HOME": str(tmp_path)}
    installed = subprocess.run(
        [*command, "--install-completion", "bash"], env=env, capture_output=True, text=True, timeout=60
    )
    assert installed.returncode == 0, installed.stderr
    script = tmp_path / ".bash_completions" / "looptpl.sh"
    assert script.read_text().strip() == shown.stdout.strip()
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()


def test_help_and_completion_start_without_the_heavy_imports():
    """`looptpl --help` and every TAB press import only Typer: copier, YAML, rich and git come with a command."""
    heavy = ["copier", "yaml", "rich", "pydantic", "looptpl.gitcmd", "looptpl.store", "looptpl.update"]
    probe = f"import sys, looptpl.cli; print([name for name in {heavy!r} if name in sys.modules])"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr
