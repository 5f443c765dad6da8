"""Render every variant, lint it, train it, and run the project's own test suite."""

import ast
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import torch
import yaml
from conftest import BACKEND_OF, KEYS, REPO_ROOT, in_parallel, looptpl, package_of, run, trained_weights, user_files

from looptpl import compiled

TORCH_STRATEGIES = [key for key in KEYS if BACKEND_OF[key] == "torch"]


MAX_FUNCTION_LINES = 60


def function_lengths(source: str) -> list[tuple[str, int]]:
    """Each function of a module (methods and nested ones too), with its length in lines."""
    nodes = ast.walk(ast.parse(source))
    functions = [node for node in nodes if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    return [(function.name, (function.end_lineno or function.lineno) - function.lineno + 1) for function in functions]


@pytest.mark.parametrize("strategy", KEYS)
def test_rendered_project_is_lint_and_type_clean_without_template_leftovers(projects, strategy):
    project = projects[strategy]
    for path in project.rglob("*"):
        if path.is_file() and ".git" not in path.parts:
            text = path.read_text()
            assert "{{" not in text and "{%" not in text, path
            if path.suffix == ".py":  # short functions, so that a reader holds each one in view
                long = [name for name, lines in function_lengths(text) if lines > MAX_FUNCTION_LINES]
                assert not long, f"{path}: functions longer than {MAX_FUNCTION_LINES} lines: {long}"
    # The checks of the project's CI workflow, run here: the project passes them from its first push.
    # Its own pyproject.toml configures ruff and mypy; a shared mypy cache keeps this quick.
    steps = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())["jobs"]["check"]["steps"]
    commands = [step["run"] for step in steps if "run" in step and "pip install" not in step["run"]]
    assert commands == ["ruff check .", "ruff format --check .", "mypy", "python -m pytest"]
    # The README shows the config file the project's own test reads (test_mistakes.py).
    assert "--config configs/base.toml" in (project / "README.md").read_text()
    cache = {"MYPY_CACHE_DIR": str(project.parent / ".mypy_cache")}
    for command in commands[:-1]:  # the tests run in test_generated_project_passes_its_own_tests
        result = run([sys.executable, "-m", *command.split()], cwd=project, timeout=300, env=cache)
        assert result.returncode == 0, result.stdout


# The reading path: the .py files directly in src/PKG/ (the loop file, the strategy's file, the user's
# files); everything else lives in src/PKG/kit/. A newcomer reads the whole run in these.
READING_PATH_FILES, READING_PATH_LINES = 10, 1200


@pytest.mark.parametrize("strategy", KEYS)
def test_the_reading_path_is_ten_files_and_1200_lines_at_most(projects, strategy):
    package = projects[strategy] / "src" / package_of(projects[strategy])
    files = sorted(path for path in package.glob("*.py") if path.name != "__init__.py")
    lines = sum(len(path.read_text().splitlines()) for path in files)
    assert len(files) <= READING_PATH_FILES, [path.name for path in files]
    assert lines <= READING_PATH_LINES, f"{strategy}: the reading path holds {lines} lines"
    assert {"train.py", "distributed.py"} | user_files(package) == {path.name for path in files}
    # The user's files import the template from kit.api and kit.config only, never its internals.
    for name in user_files(package):
        imported = re.findall(r"^from \.(\S+) import", (package / name).read_text(), flags=re.MULTILINE)
        assert {module for module in imported if module.startswith("kit")} <= {"kit.api", "kit.config"}, name
    # kit/ imports none of the user's files: the loop hands it what it needs (config.py builds on settings.py).
    for path in (package / "kit").glob("*.py"):
        imported = set(re.findall(r"^from \.\.(\w+)? ?import (\w+)", path.read_text(), flags=re.MULTILINE))
        yours = {module or name for module, name in imported} & {
            name.removesuffix(".py") for name in user_files(package)
        }
        assert yours <= ({"settings"} if path.name == "config.py" else set()), (path.name, yours)


# Words of FSDP's code: a single project holds none of them, in any file; a ddp project may name fsdp
# as the strategy to switch to, but holds no sharding code.
SHARDING_WORDS = {
    "single": r"fsdp|dtensor|\bdcp\b|\.dcp\b|shard_units|fully_shard|sharded",
    "ddp": r"dtensor|\.dcp\b|\bsharded\b",
}


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_only_an_fsdp_project_holds_sharding_code(projects, strategy):
    """FSDP's modules (sharded checkpoints, consolidate) are rendered into fsdp projects only."""
    project = projects[strategy]
    kit = project / "src" / package_of(project) / "kit"
    assert not {"sharded.py", "consolidate.py"} & {path.name for path in kit.iterdir()}
    for path in project.rglob("*"):
        caches = {".git", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
        if path.is_file() and not caches & set(path.parts):
            found = re.findall(SHARDING_WORDS[strategy], path.read_text(), flags=re.IGNORECASE)
            assert not found, f"{path.relative_to(project)}: {sorted(set(found))}"


@pytest.mark.parametrize("strategy", TORCH_STRATEGIES)
def test_one_function_holds_the_backward_the_clip_and_the_optimizer_step(projects, strategy):
    """The update reads as one function of train.py, as a hand-written loop has it."""
    train = (projects[strategy] / "src" / package_of(projects[strategy]) / "train.py").read_text()
    functions = [node for node in ast.walk(ast.parse(train)) if isinstance(node, ast.FunctionDef)]
    update = [ast.unparse(node) for node in functions if ".backward()" in ast.unparse(node)]
    assert len(update) == 1 and ".step(stage.optimizer)" in update[0] and "max_grad_norm" in update[0]


@pytest.mark.parametrize("strategy", KEYS)
def test_one_optimizer_takes_train_steps_loss_without_the_protocol_of_several(projects, strategy):
    """With one optimizer the loss is train_step's return value; the generator protocol of several optimizers
    (a GAN) lives in a function of its own, which a one-optimizer run does not go through."""
    train = (projects[strategy] / "src" / package_of(projects[strategy]) / "train.py").read_text()
    nodes = [node for node in ast.walk(ast.parse(train)) if isinstance(node, ast.FunctionDef)]
    functions = {node.name: ast.unparse(node) for node in nodes}
    if BACKEND_OF[strategy] == "jax":  # one optimizer only, so far: the compiled update's loss is train_step's
        assert "train_step(model, batch, config)" in functions["loss_sums"]
        assert not [name for name, code in functions.items() if "micro_step_losses(" in code]
        return
    assert re.search(r"loss = train_step\(self\.models, (micro_)?batch, self\.config\)", functions["train_loss"])
    protocol = [name for name, code in functions.items() if "micro_step_losses(" in code]
    if strategy in {"single", "ddp", "fsdp"}:
        assert protocol == ["update_each_optimizer"]
        assert "self.update_each_optimizer(" in functions["update"].split("else:")[-1]
    else:  # TensorFlow: the replica's update asks for the generator in its branch for several optimizers
        assert protocol == ["losses"]
        asked = [line for line in functions["_replica_update"].splitlines() if "self.losses(" in line]
        assert asked and all(line.endswith("if len(self.stages) > 1 else []") for line in asked), asked
        assert "self.train_loss" in functions["_whole_micro_step"]


@pytest.mark.parametrize("strategy", ["single", "one-device"])
def test_the_tests_budget_in_settings_py_becomes_flags_and_what_the_tests_expect(projects, strategy, tmp_path):
    """settings.py's TEST_DEFAULTS: flags every test run gets first, and the counts tests/project.py expects."""
    project = tmp_path / projects[strategy].name  # the package's name
    shutil.copytree(projects[strategy], project, ignore=shutil.ignore_patterns("__pycache__", ".mypy_cache"))
    settings = project / "src" / package_of(project) / "settings.py"
    budget = '{"steps_per_epoch": 8, "eval_batches": 1, "eval_batch_size": 50, "progress": False}'
    settings.write_text(settings.read_text().replace("TEST_DEFAULTS: dict[str, Any] = {}", f"TEST_DEFAULTS = {budget}"))
    read = "from project import *; print(flags_for_tests(), updates_per_epoch(), evaluated_samples('val'))"
    result = run([sys.executable, "-c", read], cwd=project / "tests", env={"PYTHONPATH": "../src"})
    assert result.returncode == 0, result.stdout
    flags = "('--steps-per-epoch', '8', '--eval-batches', '1', '--eval-batch-size', '50', '--no-progress')"
    # torch: epochs of 8 updates, evaluations of 1 batch of 50; TensorFlow's tests train TRAIN_FLAGS' runs
    # (epochs of 26 updates at most, evaluation batches of 100), and take the evaluation budget.
    assert result.stdout.split("\n")[-2] == f"{flags} " + ("8 50" if strategy == "single" else "26 100")
    settings.write_text(settings.read_text().replace('"progress"', '"progres"'))
    result = run([sys.executable, "-c", read], cwd=project / "tests", env={"PYTHONPATH": "../src"})
    assert "settings.py: TEST_DEFAULTS names progres, which is no flag (see --help)" in result.stdout


def test_the_contract_check_names_every_missing_name_and_wrong_signature_at_once(projects, tmp_path):
    """kit/contract.py reads the user's files: what it must refuse, and what it must let through."""
    project = tmp_path / "single"
    shutil.copytree(projects["single"], project, ignore=shutil.ignore_patterns("__pycache__", ".mypy_cache", ".git"))
    package = project / "src" / "single"

    def edit(name: str, old: str, new: str) -> None:
        text = (package / name).read_text()
        assert old in text, (name, old)
        (package / name).write_text(text.replace(old, new))

    # Let through: a default, *args, a name imported from elsewhere, one assigned under try, a `*` import.
    edit("step.py", "def train_step(model: nn.Module, batch: Any, config: TrainConfig)", "def train_step(*args: Any)")
    edit("optim.py", "total_steps: int\n", "total_steps: int, log: bool = False\n")
    edit("model.py", "def build_model(", "from .data import NUM_CLASSES as build_model  # noqa\n\n\ndef build_net(")
    edit("data.py", "def build_datasets(", "def _build_datasets(")
    chosen = "try:\n    from .fast import build_datasets\nexcept ImportError:\n    build_datasets = _build_datasets\n"
    edit("data.py", "NUM_CLASSES = 4", "NUM_CLASSES, OTHER = 4, 5  # model.py and metrics.py import it")
    (package / "data.py").write_text((package / "data.py").read_text() + chosen)
    (package / "metrics.py").write_text("from .loss import *  # noqa: F403\n")
    result = run([sys.executable, "-m", "single.kit.contract"], cwd=project, env={"PYTHONPATH": "src"})
    assert result.returncode == 0, result.stdout

    # Refuse, all at once: too few arguments, a keyword the loop never passes, a missing file, a missing
    # function, and a name one file imports from another that lacks it.
    edit("step.py", "def eval_step(model: nn.Module, batch: Any, config: TrainConfig)", "def eval_step(model, batch)")
    edit("optim.py", "def build_optimizer(model: nn.Module, config: TrainConfig)", "def build_optimizer(m, c, *, lr)")
    (package / "hooks.py").unlink()
    edit("data.py", chosen, "")
    (package / "metrics.py").write_text("from .loss import per_sample_loss\n")
    edit("step.py", "from .loss import per_sample_loss", "from .loss import per_sample_los")
    result = run([sys.executable, "-m", "single.kit.contract"], cwd=project, env={"PYTHONPATH": "src"})
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    expected = [
        "error: hooks.py: missing; the loop imports it, so make it again (see docs/todos.md#hookspy)",
        "error: data.py: defines no build_datasets(config), which the loop calls; add it (see docs/todos.md#datapy)",
        "error: step.py:36: eval_step must take 3 arguments, eval_step(model, batch, config), as the loop passes them",
        "error: metrics.py: defines no dataset_metrics(means, gathered), which the loop calls",
        "error: optim.py:13: build_optimizer must take 2 arguments, build_optimizer(model, config),",
        "error: step.py:20: imports batch_metrics from metrics.py, which defines no batch_metrics; add it there",
        "error: step.py:19: imports per_sample_los from loss.py, which defines no per_sample_los;",
    ]
    assert len(lines) == len(expected) and all(any(line.startswith(e) for line in lines) for e in expected), lines


# shard_units mistakes (fsdp's model.py) and what a run on one process says, before any sharding.
SHARD_UNITS_MISTAKES = {
    "return [model]": "got the Sequential itself: return the blocks in it",
    "return [*model.children(), next(model.children())]": "got a Linear twice: return each block once",
    "pass": "got NoneType",  # a forgotten return
}


def test_shard_units_mistakes_are_one_line_on_one_process_too(projects, tmp_path):
    """FSDP shards only on several ranks, but what shard_units returns is checked on one process too."""
    default = "    return [layer for layer in model.children() if any(p.requires_grad for p in layer.parameters())]"
    copies = []
    for index, mistake in enumerate(SHARD_UNITS_MISTAKES):
        copy = tmp_path / f"mistake{index}" / "fsdp"
        shutil.copytree(projects["fsdp"], copy, ignore=shutil.ignore_patterns("__pycache__", ".mypy_cache", ".git"))
        model = copy / "src" / "fsdp" / "model.py"
        assert default in model.read_text()
        model.write_text(model.read_text().replace(default, f"    {mistake}"))
        copies.append(copy)
    train = [sys.executable, "-m", "fsdp.train", "--device", "cpu", "--epochs", "1", "--no-progress"]
    results = in_parallel(
        *[
            lambda copy=copy: run([*train, "--run-dir", str(copy / "run")], cwd=copy, env={"PYTHONPATH": "src"})
            for copy in copies
        ]
    )
    for result, message in zip(results, SHARD_UNITS_MISTAKES.values(), strict=True):
        expected = f"error: model.py: shard_units(model) must return a list of the model's blocks; {message}\n"
        assert result.returncode == 1 and result.stdout.endswith(expected), result.stdout


@pytest.mark.parametrize("strategy", KEYS)
def test_todos_live_only_in_user_files(projects, strategy):
    package = projects[strategy] / "src" / package_of(projects[strategy])
    yours = user_files(package)
    assert {"data.py", "model.py", "loss.py", "metrics.py", "optim.py"} <= yours
    with_todos = {path.name for path in package.glob("*.py") if "TODO" in path.read_text()}
    # hooks.py is yours too, but optional: its defaults do nothing and ask for nothing.
    assert with_todos == yours - {"hooks.py"}
    assert "This file is yours" in (package / "hooks.py").read_text()
    for path in package.rglob("*.py"):
        if path.parent != package or path.name not in yours | {"__init__.py"}:
            assert "Managed by the looptpl template" in path.read_text().split('"""')[1], path


@pytest.mark.parametrize("strategy", KEYS)
def test_readme_table_names_every_file_of_the_package_and_whose_it_is(projects, strategy):
    """The generated README's "What to edit first" table: the user's files say yes, every other module no."""
    package = projects[strategy] / "src" / package_of(projects[strategy])
    named: dict[str, set[str]] = {"yes": set(), "no": set()}
    for line in (projects[strategy] / "README.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            owner = cells[2].split(":")[0]
            named[owner] |= {name.removeprefix(f"src/{package.name}/") for name in re.findall(r"`([^`]+)`", cells[0])}
    modules = {path.name for path in package.glob("*.py")} - {"__init__.py"}
    assert named["yes"] == user_files(package)
    assert modules - named["yes"] - named["no"] == set(), "modules the README's table leaves out"
    stale = {name for name in named["no"] if not (package / name).exists() and not (projects[strategy] / name).exists()}
    assert stale == set(), "files the README's table names that the project lacks"


def train(project: Path, run_dir: Path, *flags: str, ranks: int = 1) -> subprocess.CompletedProcess:
    module = ["-m", f"{package_of(project)}.train", "--run-dir", str(run_dir), "--no-progress", "--device", "cpu"]
    launcher = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    if ranks > 1:
        launcher.append(f"--nproc-per-node={ranks}")
    hidden = [] if project.name == "fsdp" and ranks > 1 else [str(project.parent / "no_numpy")]  # see `projects`
    python_path = os.pathsep.join([*hidden, str(project / "src")])
    result = run([*launcher, *module, *flags], cwd=project, timeout=600, env={"PYTHONPATH": python_path})
    assert result.returncode == 0, result.stdout[-8000:]
    return result


@pytest.mark.slow
@pytest.mark.skipif("single" not in TORCH_STRATEGIES, reason="needs the single variant as reference")
def test_torch_strategies_on_two_ranks_match_single(projects, tmp_path):
    """ddp and fsdp on 2 CPU ranks end with the weights of the single-process project (single and ddp without numpy)."""
    strategies = [strategy for strategy in ("ddp", "fsdp") if strategy in projects]
    two_ranks = ("--epochs", "2", "--grad-accum-steps", "2")
    in_parallel(
        lambda: train(projects["single"], tmp_path / "single", "--epochs", "2"),
        *(
            functools.partial(train, projects[strategy], tmp_path / strategy, *two_ranks, ranks=2)
            for strategy in strategies
        ),
    )
    reference = trained_weights(tmp_path / "single")
    for strategy in strategies:
        weights = trained_weights(tmp_path / strategy)
        assert weights.keys() == reference.keys()
        for name, tensor in reference.items():
            torch.testing.assert_close(weights[name], tensor, atol=1e-5, rtol=1e-5, msg=f"{strategy} {name}")


@pytest.mark.skipif("single" not in TORCH_STRATEGIES, reason="needs the single variant")
def test_a_first_run_prints_no_warning(projects, tmp_path):
    """The README's first run, with the project's dependencies installed, shows the user only their run.

    (torch warns at import when numpy is missing, which is why the generated pyproject.toml lists it.)
    """
    module = ["-m", "single.train", "--run-dir", str(tmp_path), "--device", "cpu", "--epochs", "1"]
    result = run([sys.executable, *module], cwd=projects["single"], env={"PYTHONPATH": str(projects["single"] / "src")})
    assert result.returncode == 0, result.stdout[-3000:]
    assert "warning" not in result.stdout.lower(), result.stdout
    assert '"numpy"' in (projects["single"] / "pyproject.toml").read_text()


def test_a_run_in_a_terminal_says_where_it_trains_how_far_it_is_and_where_its_results_are(projects, tmp_path):
    """The README's first run, twice, on a person's screen (a pseudo-terminal): each run gets a folder of its own."""
    import pexpect

    project = shutil.copytree(projects["single"], tmp_path / "single")  # runs/ is made in the folder of the command
    environment = {**os.environ, "PYTHONPATH": str(project / "src"), "COLUMNS": "100"}
    command = ["-m", "single.train", "--device", "cpu", "--epochs", "2", "--log-every", "4"]
    folders = []
    for _ in range(2):  # the same command again: a new run beside the first, not "already holds a run"
        child = pexpect.spawn(sys.executable, command, cwd=project, env=environment, encoding="utf-8", timeout=120)
        stamp = r"runs/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d(-\d+)?"
        child.expect(rf"run ({stamp}): cpu, [\d.]+k weights, [\d,]+ training samples; 2 epochs of \d+ updates of 64")
        folder = child.match.group(1)
        # The bar: how far, the loss, the speed, time spent and left; it clears what a longer line left.
        child.expect(r"epoch 1/2 \[[#.]{24}\] \d+/\d+  loss \d\.\d{4}  [\d,]+ samples/s  \d+:\d\d left \d+:\d\d\x1b\[K")
        child.expect(rf"run folder   {re.escape(folder)}  \(took [^)]+\)")
        child.expect(rf"plot         python -m single\.kit\.plot {re.escape(folder)}")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0, child.before
        folders.append(folder)
    assert folders[0] != folders[1] and all((project / folder / "summary.json").is_file() for folder in folders)
    assert (project / "runs" / "latest").resolve() == (project / folders[1]).resolve()


def test_rendering_is_deterministic(tmp_path):
    for copy in ("first", "second"):
        result = looptpl("new", str(tmp_path / copy / "proj"), "--strategy", "ddp", "--backend", "torch", "--no-git")
        assert result.exit_code == 0, result.stderr
    first, second = tmp_path / "first" / "proj", tmp_path / "second" / "proj"
    files = sorted(path.relative_to(first) for path in first.rglob("*") if path.is_file())
    assert files == sorted(path.relative_to(second) for path in second.rglob("*") if path.is_file())
    for path in files:
        first_bytes, second_bytes = (first / path).read_bytes(), (second / path).read_bytes()
        if path.name == ".copier-answers.yml" and DIRTY_CHECKOUT:
            # Copier records a throwaway commit (with a timestamp) for uncommitted template edits.
            first_bytes, second_bytes = (re.sub(rb"_commit: .*", b"", text) for text in (first_bytes, second_bytes))
        assert first_bytes == second_bytes, path


def test_jinja_code_is_reused_only_for_the_same_source_and_settings():
    # Renders reuse the code Jinja compiled for a template file (looptpl/compiled.py): never across
    # environments whose settings make other code of the same source.
    compiled.copier()
    cache = jinja2.Environment.compile.cache  # type: ignore[attr-defined]
    source = "[[ name ]] {{ name }}"
    entries = len(cache)
    assert jinja2.Environment().from_string(source).render(name="x") == "[[ name ]] x"
    square = jinja2.Environment(variable_start_string="[[", variable_end_string="]]")
    assert square.from_string(source).render(name="x") == "x {{ name }}"
    assert len(cache) == entries + 2
    assert jinja2.Environment().from_string(source).render(name="y") == "[[ name ]] y"  # a new environment alike
    assert len(cache) == entries + 2


def test_plain_copier_copy_from_a_git_checkout(tmp_path):
    """`copier copy` works on a git checkout of this repository, without looptpl."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy(REPO_ROOT / "copier.yml", checkout)
    shutil.copytree(REPO_ROOT / "templates", checkout / "templates")
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "template"]):
        subprocess.run(command, cwd=checkout, check=True, env=GIT_ENV)
    subprocess.run(["git", "tag", "v0.1.0"], cwd=checkout, check=True)
    result = run(
        [sys.executable, "-m", "copier", "copy", "--defaults", "-d", "project_name=plain", "-d", "strategy=ddp",
         str(checkout), str(tmp_path / "plain")],
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout
    answers = (tmp_path / "plain" / ".copier-answers.yml").read_text()
    assert "_commit: v0.1.0" in answers
    assert (tmp_path / "plain" / "src" / "plain" / "distributed.py").is_file()


TEMPLATE_STATUS = ["git", "status", "--porcelain", "--", "templates", "copier.yml"]
DIRTY_CHECKOUT = bool(subprocess.run(TEMPLATE_STATUS, cwd=REPO_ROOT, capture_output=True).stdout)

GIT_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@localhost",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@localhost",
    "PATH": os.environ["PATH"],
}


# Files that are one idea in both backends are held once, in templates/shared/, and each backend's tree
# includes them (`{% include "templates/shared/..." %}`): no two files of the trees are the same text.
INCLUDE = re.compile(r'{% include "(templates/shared/[^"]+)" %}')


def test_no_file_is_held_twice_in_the_backends_trees():
    torch_tree, tensorflow_tree = (REPO_ROOT / "templates" / backend for backend in ("torch", "tensorflow"))
    included = set()
    for path in torch_tree.rglob("*"):
        twin = tensorflow_tree / path.relative_to(torch_tree)
        if not path.is_file() or not twin.is_file() or path.read_bytes() != twin.read_bytes():
            continue
        # The same text in both trees: only a one-line include of the shared source.
        match = INCLUDE.fullmatch(path.read_text())
        assert match and (REPO_ROOT / match[1]).is_file(), f"templates/*/{path.relative_to(torch_tree)} is held twice"
        included.add(match[1])
    # Parts of files that differ between the backends are included too (a logger, the step's checks), by
    # any backend's files (JAX's too) or by a shared file.
    jax_tree, shared_tree = REPO_ROOT / "templates" / "jax", REPO_ROOT / "templates" / "shared"
    for path in [*torch_tree.rglob("*.jinja"), *tensorflow_tree.rglob("*.jinja"), *jax_tree.rglob("*.jinja")]:
        included.update(INCLUDE.findall(path.read_text()))
    for path in shared_tree.rglob("*"):
        if path.is_file():
            included.update(INCLUDE.findall(path.read_text()))
    shared = {
        str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "templates" / "shared").rglob("*") if path.is_file()
    }
    assert shared == included, "files in templates/shared/ that neither tree includes"


# Backend-neutral functions and classes inside files that differ between the backends: the same text in both.
SHARED_DEFINITIONS = {
    "src/{{package_name}}/kit/collect.py": ["evaluation"],
    "src/{{package_name}}/kit/errors.py.jinja": [
        "ConfigError",
        "TrainingError",
        "CheckpointError",
        "in_your_files",
        "import_failure",
    ],
    "src/{{package_name}}/kit/evaluation.py": ["finite_or_raise"],
    "tests/conftest.py.jinja": ["step_records", "data_prepared"],
}


def top_level_definitions(path: Path) -> dict[str, str]:
    """Each top-level `def` or `class` of a template file, by name: its lines up to the next unindented
    one (Jinja tags count as its lines, so a branch inside a definition is compared too)."""
    definitions: dict[str, str] = {}
    lines = path.read_text().splitlines()
    for start, line in enumerate(lines):
        if match := re.match(r"(?:def|class) (\w+)", line):
            end = start + 1
            while end < len(lines) and (not lines[end] or lines[end][0] in " )" or lines[end].startswith("{%")):
                end += 1
            assert match[1] not in definitions, f"{path} defines {match[1]} twice: compare the variants' renders"
            definitions[match[1]] = "\n".join(lines[start:end]).rstrip()
    return definitions


@pytest.mark.parametrize("path", SHARED_DEFINITIONS)
def test_backend_neutral_definitions_stay_identical(path):
    torch_copy, tensorflow_copy = (
        top_level_definitions(REPO_ROOT / "templates" / backend / path) for backend in ("torch", "tensorflow")
    )
    for name in SHARED_DEFINITIONS[path]:
        assert name in torch_copy and torch_copy.get(name) == tensorflow_copy.get(name), f"{name} in templates/*/{path}"
