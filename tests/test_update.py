"""Template updates keep every user edit: generate at v1.0.0, fill every TODO, update to v1.1.0.

Tested the way copier tests itself: a temporary template repository holds this checkout's template
as v1.0.0 and a fix (engine, README, pyproject, a new file, and a change to a user-owned file) as
v1.1.0. An installed looptpl is simulated in-process by pointing it at an export of one tag (as a
wheel ships it), and for real by building two wheels and upgrading a fresh virtual environment.
"""

import io
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, TENSORFLOW, TORCH, answers, in_parallel, looptpl, run

import looptpl as looptpl_package
from looptpl import store, template_source
from looptpl.errors import LooptplError
from looptpl.update import update_project

V1, V2 = "v1.0.0", "v1.1.0"
USER_FILES = ("data", "model", "step", "loss", "metrics", "optim", "settings", "hooks")
ENGINE_FIX = "  # looptpl v1.1.0: engine fix"
README_FIX = "Template fix from v1.1.0: see docs/updating.md."
PYPROJECT_FIX = "# looptpl v1.1.0: pyproject fix"
USER_FILE_CHANGE = "# looptpl v1.1.0 changed this user-owned file"
RELEASE_NOTE = "- Results change for the same seed: the data order of v1.1.0 differs."
USER_ENGINE_NOTE = "# My engine note: keep this."
USER_README_LINE = "My notes: this model is trained on my cluster."
USER_PYPROJECT = '\n[tool.my_tool]\nsetting = "mine"\n'
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@localhost",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@localhost",
}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def copy_template(destination: Path) -> None:
    """This checkout's template (copier.yml and templates/), as a release would ship it."""
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_ROOT / "copier.yml", destination)
    shutil.copytree(
        REPO_ROOT / "templates", destination / "templates", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )


def template_file(root: Path, name: str) -> Path:
    package = root / "templates" / "torch" / "src" / "{{package_name}}"
    return next(path for path in (package / name, package / f"{name}.jinja") if path.is_file())


def first_definition(lines: list[str]) -> int:
    """The first module-level class or def line: appending a comment to it keeps the file valid Python."""
    return next(index for index, line in enumerate(lines) if line.startswith(("class ", "def ")))


def make_v2_fix(root: Path) -> None:
    """The template change between v1.0.0 and v1.1.0: an engine fix, shared-file fixes, a new file."""
    engine = template_file(root, "train.py")
    lines = engine.read_text().splitlines(keepends=True)
    index = first_definition(lines)
    lines[index] = lines[index].rstrip("\n") + ENGINE_FIX + "\n"
    engine.write_text("".join(lines))
    readme = root / "templates" / "torch" / "README.md.jinja"
    readme.write_text(readme.read_text() + f"\n{README_FIX}\n")
    pyproject = root / "templates" / "torch" / "pyproject.toml.jinja"
    pyproject.write_text(f"{PYPROJECT_FIX}\n{pyproject.read_text()}")
    data = template_file(root, "data.py")
    data.write_text(data.read_text() + f"\n{USER_FILE_CHANGE}\n")
    (template_file(root, "train.py").parent / "notes.py").write_text('"""Added by template v1.1.0."""\n')
    changelog = root / "templates" / "CHANGELOG.md"
    head, older = changelog.read_text().split("\n## ", 1)
    changelog.write_text(f"{head}\n## 1.1.0\n\n{RELEASE_NOTE}\n\n## {older}")


def move_make_autocast(root: Path) -> None:
    """A template change that moves code between files: make_autocast moves to a new kit/precision.py."""
    step = template_file(root, "kit/models.py")
    text = step.read_text()
    start, end = text.index("AUTOCAST_DTYPES = "), text.index("def compile_model(")
    step.write_text(text[:start] + "from .precision import make_autocast  # noqa\n\n\n" + text[end:])
    header = (
        '"""Autocast for --precision."""\n\nimport contextlib\nfrom collections.abc import Callable\n\nimport torch\n\n'
    )
    (step.parent / "precision.py").write_text(header + text[start:end].rstrip() + "\n")


def tagged_repository(
    root: Path, change: Callable[[Path], None], first: Callable[[Path], None] = copy_template
) -> Path:
    """`first` (this checkout's template) as v1.0.0 and with `change` as v1.1.0, in a git repository at `root`."""
    first(root)
    env = {**os.environ, **GIT_IDENTITY}
    for version, step in ((V1, None), (V2, change)):
        if step:
            step(root)
        for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", f"Template {version}"]):
            subprocess.run(command, cwd=root, check=True, env=env)
        subprocess.run(["git", "tag", version], cwd=root, check=True)
    return root


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A template store of this test's own, and a git identity for the commits the tests make."""
    monkeypatch.setenv("LOOPTPL_HOME", str(tmp_path / "looptpl-home"))
    for key, value in GIT_IDENTITY.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def template_repo(tmp_path_factory) -> Path:
    """A template repository tagged v1.0.0 (this checkout's template) and v1.1.0 (with the fix)."""
    return tagged_repository(tmp_path_factory.mktemp("template-repo"), make_v2_fix)


@pytest.fixture
def install(tmp_path, monkeypatch, template_repo) -> Callable[..., Path]:
    """Make the in-process looptpl an installed release shipping the template at `tag` (an export, no .git)
    of `repository` (by default the one tagged v1.0.0 and v1.1.0 with the fix)."""

    def install_tag(tag: str, repository: Path = template_repo) -> Path:
        package = tmp_path / f"site-{repository.name}-{tag}" / "looptpl"
        if not package.exists():
            archive = tmp_path / f"{repository.name}-{tag}.tar"
            git(repository, "archive", "--output", str(archive), tag)
            (package / "_template").mkdir(parents=True)
            subprocess.run(["tar", "-xf", str(archive), "-C", str(package / "_template")], check=True)
        monkeypatch.setattr(template_source, "PACKAGE_DIR", package)
        monkeypatch.setattr(looptpl_package, "__version__", tag.removeprefix("v"))
        return package / "_template"

    return install_tag


def new_project(destination: Path, strategy: str = "single") -> Path:
    result = looptpl("new", str(destination), "--backend", "torch", "--strategy", strategy)
    assert result.exit_code == 0, result.stderr
    return destination


def edit_like_a_user(project: Path) -> dict[Path, str]:
    """Fill every TODO file, and edit the engine, README and pyproject; commit. Returns the TODO files' text."""
    package = project / "src" / answers(project)["package_name"]
    filled = {}
    for name in USER_FILES:
        path = package / f"{name}.py"
        text = path.read_text().replace("# TODO(", "# DONE(")
        text += f'\n\ndef my_{name}_helper() -> str:\n    return "{name} is mine"\n'
        path.write_text(text)
        filled[path] = text
    engine = package / "train.py"
    engine.write_text(engine.read_text() + f"\n\n{USER_ENGINE_NOTE}\n")
    readme = project / "README.md"
    title, rest = readme.read_text().split("\n", 1)
    readme.write_text(f"{title}\n\n{USER_README_LINE}\n{rest}")
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + USER_PYPROJECT)
    git(project, "commit", "-qam", "Fill the TODOs")
    return filled


def assert_updated_with_every_edit_kept(project: Path, filled: dict[Path, str]) -> None:
    package = project / "src" / answers(project)["package_name"]
    assert answers(project)["_commit"] == V2
    engine = (package / "train.py").read_text()
    assert ENGINE_FIX in engine and USER_ENGINE_NOTE in engine
    assert README_FIX in (project / "README.md").read_text()
    assert USER_README_LINE in (project / "README.md").read_text()
    pyproject = (project / "pyproject.toml").read_text()
    assert pyproject.startswith(PYPROJECT_FIX) and pyproject.endswith(USER_PYPROJECT)
    assert (package / "notes.py").is_file()  # a file new in v1.1.0 is added
    for path, text in filled.items():
        assert path.read_text() == text, f"{path.name} is user-owned and must not change"
    for path in project.rglob("*"):
        if path.is_file() and ".git" not in path.parts and path.suffix != ".merged":
            assert not path.name.endswith(".rej"), path
            assert "<<<<<<<" not in path.read_text() and ">>>>>>>" not in path.read_text(), path


@pytest.mark.slow
def test_looptpl_new_then_update_keeps_every_user_edit_and_still_trains(tmp_path, install):
    install(V1)
    project = new_project(tmp_path / "proj")
    assert answers(project)["_commit"] == V1
    filled = edit_like_a_user(project)
    head = git(project, "rev-parse", "HEAD")

    install(V2)  # the user upgrades looptpl
    result = looptpl("check", str(project))
    assert result.exit_code == 1
    assert f"uses template {V1}" in result.stdout and V2 in result.stdout

    preview = looptpl("update", str(project), "--dry-run")
    assert preview.exit_code == 0, preview.stderr
    for changed in ("src/proj/train.py", "README.md", "pyproject.toml", "src/proj/notes.py"):
        assert changed in preview.stdout
    listed, owned = preview.stdout.split("The template changed its own version of files you own")
    assert "src/proj/data.py" not in listed  # yours: not merged, only shown as the template's change to it
    assert f"+{USER_FILE_CHANGE}" in owned
    assert git(project, "status", "--porcelain") == "" and git(project, "rev-parse", "HEAD") == head

    result = looptpl("update", str(project))
    assert result.exit_code == 0, result.stderr
    assert f"from template {V1} to {V2}" in result.stdout
    # The release note of each version after the project's, up to the new one: v1.1.0's, not v1.0.0's.
    assert f"What changed in the template since {V1} (templates/CHANGELOG.md):\n  ## 1.1.0\n\n  {RELEASE_NOTE}\n" in (
        result.stdout
    )
    assert "## 0.1.0" not in result.stdout
    assert_updated_with_every_edit_kept(project, filled)
    # The template's change to data.py, merged into the user's copy beside it (git ignores it): both are
    # there, and where they touch the same lines (both appended a line) the offer says so with markers.
    offer = (project / "src" / "proj" / "data.py.merged").read_text()
    assert USER_FILE_CHANGE in offer and "def my_data_helper" in offer and "# DONE(" in offer
    assert "  src/proj/data.py.merged (1 conflict)" in result.stdout
    git(project, "add", "--all")
    git(project, "commit", "-qm", "Update the template")
    assert "data.py.merged" not in git(project, "show", "--name-only", "HEAD")
    assert looptpl("check", str(project)).exit_code == 0
    again = looptpl("update", str(project))
    assert again.exit_code == 0 and "already up to date" in again.stdout
    assert looptpl("todo", str(project)).exit_code == 0  # every TODO is still filled

    env = {"PYTHONPATH": str(project / "src")}
    train = [sys.executable, "-m", "proj.train", "--epochs", "1", "--device", "cpu", "--no-progress"]
    trained = run([*train, "--run-dir", str(tmp_path / "run")], cwd=project, timeout=600, env=env, preload=TORCH)
    assert trained.returncode == 0, trained.stdout[-5000:]
    # The updated project's own tests run (two: the whole suite of this template version runs in
    # tests/test_all_variants_pass_their_own_tests.py), user edits and merged test files included.
    own = ["tests/test_trackers.py", "tests/test_no_conflict_markers.py"]
    tests = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *own], cwd=project, timeout=1200)
    assert tests.returncode == 0 and " passed" in tests.stdout, tests.stdout[-8000:]


def test_merge_your_files_merges_the_templates_change_into_them_with_markers_where_they_clash(tmp_path, install):
    install(V1)
    project = new_project(tmp_path / "proj")
    filled = edit_like_a_user(project)
    data = project / "src" / "proj" / "data.py"

    install(V2)
    preview = looptpl("update", str(project), "--dry-run", "--merge-your-files")
    assert preview.exit_code == 0 and f"looptpl update {project} --merge-your-files` to apply" in preview.stdout
    assert data.read_text() == filled[data]

    result = looptpl("update", str(project), "--merge-your-files")
    # data.py: the user's edits and the template's change, both there; both appended a line, so that
    # place holds conflict markers, and the update says the file needs attention.
    assert result.exit_code == 3, (result.stdout, result.stderr)
    merged = data.read_text()
    assert USER_FILE_CHANGE in merged and "def my_data_helper" in merged and "# DONE(" in merged
    assert merged.count("<<<<<<< yours") == 1 and f">>>>>>> template {V2}" in merged
    assert "merged into them" in result.stdout and "  src/proj/data.py (1 conflict)" in result.stdout
    assert "apply what you want of these changes by hand" not in result.stdout  # merged already
    assert "need attention: src/proj/data.py" in result.stderr
    assert not list(project.rglob("*.merged"))
    for path, text in filled.items():  # the other files of yours: the template did not change them
        assert path == data or path.read_text() == text


def test_a_project_inside_a_monorepo_joins_it_and_updates_there(tmp_path, install):
    install(V1)
    monorepo = tmp_path / "monorepo"
    monorepo.mkdir()
    git(monorepo, "init", "-q")
    project = monorepo / "models" / "proj"
    result = looptpl("new", str(project), "--backend", "torch", "--strategy", "single")
    assert result.exit_code == 0, result.stderr
    assert f"lies inside the git repository {monorepo}" in result.stdout
    assert not (project / ".git").exists()  # no repository nested in the monorepo
    assert git(monorepo, "status", "--porcelain").strip() == "?? models/"
    git(monorepo, "add", "--all")
    git(monorepo, "commit", "-qm", "Add proj")

    install(V2)
    result = looptpl("update", str(project))
    assert result.exit_code == 0, result.stderr
    assert ENGINE_FIX in (project / "src" / "proj" / "train.py").read_text()
    assert git(monorepo, "status", "--porcelain", "--", "models").strip()  # the merge waits for review


def test_plain_copier_copy_and_copier_update_keep_every_user_edit(tmp_path, template_repo):
    """Without looptpl: `copier copy` from a git checkout, then `copier update` to the newest tag."""
    project = tmp_path / "plain"
    copy = [sys.executable, "-m", "copier", "copy", "--defaults", "--vcs-ref", V1, "-d", "project_name=plain"]
    result = run([*copy, "-d", "strategy=ddp", str(template_repo), str(project)], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout
    assert answers(project)["_src_path"] == str(template_repo) and answers(project)["_commit"] == V1
    git(project, "init", "-q")
    git(project, "add", "--all")
    git(project, "commit", "-qm", "Generate")
    filled = edit_like_a_user(project)

    result = run([sys.executable, "-m", "copier", "update", "--defaults"], cwd=project, timeout=300)
    assert result.returncode == 0, result.stdout
    assert_updated_with_every_edit_kept(project, filled)
    assert (project / "src" / "plain" / "distributed.py").is_file()


EXTRA = "src/{{package_name}}/kit/extra.py"  # a template file that the next version drops


def with_an_extra_file(root: Path) -> None:
    copy_template(root)
    (root / "templates" / "torch" / EXTRA).write_text('"""A module of this template version only."""\n\nVALUE = 1\n')


def drop_the_extra_file(root: Path) -> None:
    (root / "templates" / "torch" / EXTRA).unlink()


@pytest.mark.parametrize("tool", ["looptpl", "copier"])
def test_a_template_file_you_edited_that_the_update_removes_is_named(tmp_path, install, tool):
    repository = tagged_repository(tmp_path / "template", drop_the_extra_file, first=with_an_extra_file)
    project = tmp_path / "proj"
    if tool == "looptpl":
        install(V1, repository)
        new_project(project)
    else:
        copy = [sys.executable, "-m", "copier", "copy", "--defaults", "--vcs-ref", V1, "-d", "project_name=proj"]
        assert run([*copy, str(repository), str(project)], cwd=tmp_path, timeout=300).returncode == 0
        for command in (["init", "-q"], ["add", "--all"], ["commit", "-qm", "Generate"]):
            git(project, *command)
    extra = project / EXTRA.replace("{{package_name}}", "proj")
    extra.write_text(extra.read_text().replace("VALUE = 1", "VALUE = 2  # mine"))
    git(project, "commit", "-qam", "My value")
    if tool == "looptpl":
        install(V2, repository)
        result = looptpl("update", str(project))
        assert result.exit_code == 3, (result.stdout, result.stderr)
        shown = "(the update removed the file: `git show HEAD:./src/proj/kit/extra.py` shows yours)"
        assert f"src/proj/kit/extra.py line 3: that template code is gone from the new version {shown}" in result.stdout
    else:  # plain copier removes it without a word: the project's own test names it
        updated = run([sys.executable, "-m", "copier", "update", "--defaults"], cwd=project, timeout=300)
        assert updated.returncode == 0, updated.stdout
    assert not extra.exists()
    test = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_no_conflict_markers.py"]
    result = run(test, cwd=project, timeout=300)
    assert result.returncode == 1 and "the update removed src/proj/kit/extra.py, which you had edited" in result.stdout
    assert "VALUE = 2  # mine" in git(project, "show", "HEAD:./src/proj/kit/extra.py")  # where the message points


def test_conflicting_engine_edit_leaves_markers_and_loses_nothing(tmp_path, install):
    install(V1)
    project = new_project(tmp_path / "proj")
    engine = project / "src" / "proj" / "train.py"
    lines = engine.read_text().splitlines()
    index = first_definition(lines)
    template_line = lines[index] + ENGINE_FIX
    lines[index] += "  # my change to this very line"
    engine.write_text("\n".join(lines) + "\n")
    git(project, "commit", "-qam", "Edit the engine")
    mine = engine.read_text()

    install(V2)
    preview = looptpl("update", str(project), "--dry-run")
    assert preview.exit_code == 3 and "src/proj/train.py" in preview.stdout.split("clash")[1]
    assert preview.stderr.strip() == "1 file(s) would need attention: src/proj/train.py"
    assert "moved to another file or removed" not in preview.stdout  # rewritten in place: a clash, not a move
    # data.py is the user's: an update keeps it as it is, and shows what the template changed in its own.
    assert "+++ src/proj/data.py\t(template v1.1.0)" in preview.stdout and f"+{USER_FILE_CHANGE}" in preview.stdout
    assert git(project, "status", "--porcelain") == ""

    result = looptpl("update", str(project))
    assert result.exit_code == 3
    assert result.stderr.strip() == "1 file(s) need attention: src/proj/train.py"
    assert f"+{USER_FILE_CHANGE}" in result.stdout
    assert USER_FILE_CHANGE not in (project / "src" / "proj" / "data.py").read_text()
    # A user of plain `copier update` is told too: the project's own tests name the file.
    leftovers = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_no_conflict_markers.py"],
        cwd=project,
        timeout=300,
    )
    assert leftovers.returncode == 1
    assert "src/proj/train.py:" in leftovers.stdout and "conflict markers" in leftovers.stdout
    unfinished = looptpl("check", str(project))
    assert unfinished.exit_code == 3 and "conflict markers or a .rej file for src/proj/train.py;" in unfinished.stderr
    merged = engine.read_text()
    assert "<<<<<<< before updating" in merged and ">>>>>>> after updating" in merged
    assert template_line in merged.splitlines()
    for line in mine.splitlines():
        assert line in merged, f"lost: {line}"
    assert README_FIX in (project / "README.md").read_text()  # the rest merged cleanly

    git(project, "reset", "--hard", "-q")  # undo, as the output says, and ask for .rej files instead
    git(project, "clean", "-fdq")
    result = looptpl("update", str(project), "--conflict", "rej")
    assert result.exit_code == 3
    assert "src/proj/train.py" in result.stderr and ".rej" in result.stdout
    assert looptpl("check", str(project)).exit_code == 3  # the .rej file marks the update unfinished
    assert template_line in engine.read_text().splitlines() and "<<<<<<<" not in engine.read_text()
    assert "+" + lines[index] in (project / "src" / "proj" / "train.py.rej").read_text().splitlines()


def test_update_from_a_development_checkout(tmp_path, monkeypatch, template_repo):
    """Run from a git checkout, looptpl renders its working tree and updates to its HEAD."""
    checkout = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(template_repo), str(checkout))
    git(checkout, "checkout", "-q", V1)
    monkeypatch.setattr(template_source, "PACKAGE_DIR", checkout / "generator" / "looptpl")
    project = new_project(tmp_path / "proj")
    assert answers(project)["_src_path"] == str(checkout) and answers(project)["_commit"] == V1
    filled = edit_like_a_user(project)
    git(checkout, "checkout", "-q", V2)
    assert looptpl("check", str(project)).exit_code == 1
    result = looptpl("update", str(project))
    assert result.exit_code == 0, result.stderr
    assert_updated_with_every_edit_kept(project, filled)
    assert not (tmp_path / "looptpl-home").exists()  # a checkout needs no template store
    git(project, "commit", "-qam", "Update the template")
    result = looptpl("check", str(project))
    assert result.exit_code == 0 and "is up to date" in result.stdout


def snapshot(project: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in sorted(project.rglob("*")) if path.is_file()}


def rewrite_answers(project: Path, **changes: str) -> None:
    data = {**answers(project), **changes}
    (project / ".copier-answers.yml").write_text(yaml.safe_dump(data))
    git(project, "commit", "-qam", "Edit the answers")


ERRORS = {
    "not a git repository": "is not a git repository; run `git init",
    "dirty working tree": "has uncommitted changes (src/proj/loss.py); commit or stash them first",
    "no answers file": "is not a looptpl project (no .copier-answers.yml)",
    "unknown template version": "template v1.0.5 is not in the template store",
    "not a release": "template version 'main' is not a looptpl release tag",
    "downgrade": "uses template v1.1.0, newer than this looptpl's v1.0.0; downgrades are not supported",
    "another template source": "follows the template at https://example.com/looptpl.git, not this looptpl's",
    "answers not YAML": "is not valid YAML (",
    "unknown backend": "backend 'mxnet' is not one of: torch, tensorflow, jax; fix that line or restore the file",
    "strategy of the other backend": "strategy 'mirrored' is not a torch strategy; use one of: single, ddp, fsdp",
    "package name edited": "package name 'my-proj' is not a valid Python identifier",
}


@pytest.mark.parametrize("case", ERRORS)
def test_update_errors_are_one_line_with_the_fix_and_change_nothing(tmp_path, install, case):
    install(V2 if case == "downgrade" else V1)
    project = tmp_path / "proj"
    result = looptpl("new", str(project), "--backend", "torch", "--strategy", "single", "--no-git")
    assert result.exit_code == 0, result.stderr
    if case != "not a git repository":
        for command in (["init", "-q"], ["add", "--all"], ["commit", "-qm", "Generate"]):
            git(project, *command)
    install(V1 if case == "downgrade" else V2)
    if case == "dirty working tree":
        (project / "src" / "proj" / "loss.py").write_text("# half-finished edit\n")
    elif case == "no answers file":
        project = project / "src"
    elif case == "unknown template version":
        rewrite_answers(project, _commit="v1.0.5")
    elif case == "not a release":
        rewrite_answers(project, _commit="main")
    elif case == "another template source":
        rewrite_answers(project, _src_path="https://example.com/looptpl.git")
    elif case == "answers not YAML":
        (project / ".copier-answers.yml").write_text("backend: [torch\n")
        git(project, "commit", "-qam", "Break the answers")
    elif case == "unknown backend":
        rewrite_answers(project, backend="mxnet")
    elif case == "strategy of the other backend":
        rewrite_answers(project, strategy="mirrored")
    elif case == "package name edited":
        rewrite_answers(project, package_name="my-proj")
    before = snapshot(project)
    result = looptpl("update", str(project))
    assert result.exit_code == 2
    assert ERRORS[case] in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
    assert snapshot(project) == before


def test_store_tags_are_deterministic_and_recorded_portably(tmp_path, monkeypatch, install):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOOPTPL_HOME")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    install(V1)
    template = store.installed_template()
    assert template.url == "~/.local/share/looptpl/template" and template.ref == V1
    here = git(tmp_path / "home" / ".local" / "share" / "looptpl" / "template", "rev-parse", V1)
    monkeypatch.setenv("LOOPTPL_HOME", str(tmp_path / "elsewhere"))
    assert store.installed_template().url == str(tmp_path / "elsewhere" / "template")
    assert git(tmp_path / "elsewhere" / "template", "rev-parse", V1) == here  # same template, same commit
    assert git(tmp_path / "elsewhere" / "template", "status", "--porcelain") == ""


def test_store_refuses_a_different_template_under_a_stored_version(tmp_path, install):
    template = install(V1)
    store.installed_template()
    (template / "copier.yml").write_text((template / "copier.yml").read_text() + "\n# edited\n")
    with pytest.raises(LooptplError, match=r"holds a different template under v1\.0\.0 .* tag -d v1\.0\.0"):
        store.installed_template()


def test_a_stored_template_is_recognised_without_running_git(tmp_path, monkeypatch, install):
    install(V1)
    stored = store.installed_template()

    def no_git(*args: str, **kwargs: object) -> str:
        raise AssertionError(f"git {' '.join(args)} ran")

    with monkeypatch.context() as patched:
        patched.setattr(store, "git", no_git)
        assert store.installed_template() == stored  # the stamp from the first run vouches for the tag
    home = tmp_path / "looptpl-home" / "template"
    git(home, "tag", "-d", V1)
    assert store.installed_template() == stored  # the tag is gone: stored again, not trusted from the stamp
    assert git(home, "tag").split() == [V1]


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, and keeps what is written to it."""

    def isatty(self) -> bool:
        return True


def test_update_shows_its_phases_on_a_terminal_only(tmp_path, monkeypatch, install):
    install(V1)
    project = new_project(tmp_path / "proj")
    install(V2)
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    monkeypatch.setenv("COLUMNS", "300")  # no line wraps
    update_project(project, dry_run=True)
    assert f"Storing the template of looptpl 1.1.0 in {tmp_path / 'looptpl-home' / 'template'}" in screen.getvalue()
    assert f"Merging template {V2} into {project}: rendering {V1} and the new template (in a clone)" in (
        screen.getvalue()
    )
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: nothing is shown
    update_project(project, dry_run=True)
    assert sys.stderr.getvalue() == ""


def test_release_tags_match_the_package_version():
    """Each release tag vX of this repository ships looptpl X, so the store tags agree with git tags."""
    from packaging.version import Version

    assert str(Version(looptpl_package.__version__)) == looptpl_package.__version__
    tags = git(REPO_ROOT, "tag", "--list", "v*").split()
    for tag in tags:
        source = git(REPO_ROOT, "show", f"{tag}:generator/looptpl/__init__.py")
        assert f'__version__ = "{tag.removeprefix("v")}"' in source, tag


def test_update_outside_a_project_as_a_subprocess(tmp_path):
    result = run([sys.executable, "-m", "looptpl", "update", str(tmp_path)], cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    no_answers = "is not a looptpl project (no .copier-answers.yml); pass the generated project's folder"
    assert result.stdout.strip() == f"error: {tmp_path} {no_answers}"


@pytest.mark.parametrize("command", ["update", "check", "rename"])
def test_help(command):
    result = looptpl(command, "--help")
    assert result.exit_code == 0 and "Usage" in result.stdout


def build_wheel(tmp_path: Path, version: str, change: Callable[[Path], None] | None) -> Path:
    """A wheel of this checkout with `version`, its template changed by `change`; built offline."""
    source = tmp_path / f"source-{version}"
    for name in ("generator", "templates", "examples"):  # the wheel ships the examples too
        shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("copier.yml", "pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source)
    init = source / "generator" / "looptpl" / "__init__.py"
    init.write_text(init.read_text().replace(f'"{looptpl_package.__version__}"', f'"{version}"'))
    if change:
        change(source)
    wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    subprocess.run([*wheel, "-w", str(tmp_path / "dist"), str(source)], check=True, capture_output=True)
    return next((tmp_path / "dist").glob(f"looptpl-{version}-*.whl"))


@pytest.mark.slow
def test_installed_wheel_upgrade_then_update(tmp_path):
    """pip install a wheel into a fresh venv, generate, upgrade to a newer wheel, `looptpl update`: offline."""
    old, new = build_wheel(tmp_path, "1.0.0", None), build_wheel(tmp_path, "1.1.0", make_v2_fix)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # copier, typer and pyyaml come from this environment: a .pth puts its site-packages after the venv's own.
    site_packages = next(venv.glob("lib/python*/site-packages"))
    (site_packages / "parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    subprocess.run([*pip, "--no-index", "--no-deps", str(old)], check=True, capture_output=True)

    home = tmp_path / "home"
    home.mkdir()
    hidden = {"LOOPTPL_HOME", "XDG_DATA_HOME", "PYTHONPATH", "VIRTUAL_ENV"}
    env = {key: value for key, value in os.environ.items() if key not in hidden} | {"HOME": str(home)}

    def installed(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(venv / "bin" / "looptpl"), *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    assert installed("--version").stdout.strip() == "looptpl 1.0.0"
    result = installed("new", "proj", "--defaults")
    assert result.returncode == 0, result.stderr
    project = tmp_path / "proj"
    assert answers(project)["_src_path"] == "~/.local/share/looptpl/template"
    assert answers(project)["_commit"] == V1
    filled = edit_like_a_user(project)

    subprocess.run([*pip, "--no-index", "--no-deps", str(new)], check=True, capture_output=True)
    assert installed("--version").stdout.strip() == "looptpl 1.1.0"
    result = installed("check", "proj")
    assert result.returncode == 1 and f"uses template {V1}" in result.stdout
    result = installed("update", "proj")
    assert result.returncode == 0, result.stdout + result.stderr
    assert_updated_with_every_edit_kept(project, filled)
    assert git(home / ".local" / "share" / "looptpl" / "template", "tag").split() == [V1, V2]


def test_update_switches_strategy_and_shows_what_your_files_newly_need(tmp_path, install):
    install(V1)
    project = new_project(tmp_path / "proj")  # single
    package = project / "src" / "proj"
    model = package / "model.py"
    model.write_text(model.read_text().replace("# TODO(model)", "# DONE(model)", 1))  # build_model's
    git(project, "commit", "-qam", "My model")
    mine = model.read_text()

    refused = looptpl("update", str(project), "--strategy", "mirrored")
    assert refused.exit_code == 2 and "a tensorflow strategy and this project is torch code" in refused.stderr
    result = looptpl("update", str(project), "--strategy", "fsdp")  # at the same template version
    # The fsdp loop calls model.py's shard_units, which a single project's model.py lacks: exit 3, saying so.
    assert result.exit_code == 3 and "1 file(s) need attention: model.py" in result.stderr, result.stderr
    assert "  model.py: defines no shard_units(model), which the loop calls; add it" in result.stdout
    assert "switching to the fsdp strategy" in result.stdout
    assert answers(project)["strategy"] == "fsdp"
    assert "fully_shard" in (package / "distributed.py").read_text()  # the engine follows
    assert model.read_text() == mine  # yours, untouched
    train = [sys.executable, "-m", "proj.train", "--device", "cpu", "--no-progress", "--epochs", "1"]
    environment = {**os.environ, "PYTHONPATH": str(project / "src")}
    before = run([*train, "--run-dir", str(tmp_path / "before")], cwd=project, env=environment, preload=TORCH)
    assert before.returncode == 1 and "error: model.py: defines no shard_units(model)" in before.stdout
    assert "Traceback" not in before.stdout

    # The update showed what the fsdp engine needs from model.py, as a diff the user can apply.
    diff = result.stdout[result.stdout.index("--- src/proj/model.py") :]
    (tmp_path / "model.diff").write_text(diff.split("\n--- ", 1)[0] + "\n")
    assert "+def shard_units(model: nn.Module)" in diff
    git(project, "apply", "-p0", str(tmp_path / "model.diff"))
    assert looptpl("check", str(project)).exit_code == 0  # what the fsdp loop calls is there now
    after = run([*train, "--run-dir", str(tmp_path / "after")], cwd=project, env=environment, preload=TORCH)
    assert after.returncode == 0, after.stdout


def test_a_jax_project_switches_to_data_parallel_keeping_your_files_and_trains_on_two_devices(tmp_path, install):
    install(V1)
    project = tmp_path / "proj"
    created = looptpl("new", str(project), "--backend", "jax", "--strategy", "single")
    assert created.exit_code == 0, created.stderr
    package = project / "src" / "proj"
    model = package / "model.py"
    model.write_text(model.read_text().replace("# TODO(model)", "# DONE(model)", 1))
    git(project, "commit", "-qam", "My model")
    mine = model.read_text()

    refused = looptpl("update", str(project), "--strategy", "ddp")
    assert refused.exit_code == 2 and "a torch strategy and this project is jax code" in refused.stderr
    result = looptpl("update", str(project), "--strategy", "data-parallel")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert answers(project)["strategy"] == "data-parallel"
    assert "make_array_from_process_local_data" in (package / "distributed.py").read_text()  # the engine follows
    assert (project / "tests" / "test_distributed.py").exists()
    assert model.read_text() == mine  # yours, untouched
    train = [sys.executable, "-m", "proj.train", "--cpu-devices", "2", "--epochs", "1", "--no-progress"]
    environment = {**os.environ, "PYTHONPATH": str(project / "src")}
    trained = run([*train, "--run-dir", str(tmp_path / "run")], cwd=project, env=environment)
    assert trained.returncode == 0, trained.stdout


def test_an_update_after_a_strategy_switch_names_no_file_as_deleted(tmp_path, install):
    # fsdp -> single drops the Slurm script and the distributed tests; a later update must not call
    # them files the user deleted (they are not the switched project's any more).
    install(V1)
    project = new_project(tmp_path / "proj", strategy="fsdp")
    switched = looptpl("update", str(project), "--strategy", "single")
    assert switched.exit_code == 0, switched.stderr
    assert not (project / "scripts").exists() and not (project / "tests" / "test_distributed.py").exists()
    git(project, "add", "-A")
    git(project, "commit", "-qm", "Switch to single")
    install(V2)
    result = looptpl("update", str(project))
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "You deleted" not in result.stdout and ENGINE_FIX in (project / "src" / "proj" / "train.py").read_text()


def add_a_question(root: Path) -> None:
    """A template version that asks one more question (with a default)."""
    with (root / "copier.yml").open("a") as copier_yml:
        copier_yml.write("\nlicense:\n  type: str\n  help: The license of the project\n  default: MIT\n")


def test_an_update_lists_the_new_questions_it_answered_with_their_defaults(tmp_path, install):
    repository = tagged_repository(tmp_path / "template", add_a_question)
    install(V1, repository)
    project = new_project(tmp_path / "proj")
    install(V2, repository)
    result = looptpl("update", str(project))
    assert result.exit_code == 0, result.stderr
    assert "answered them with their defaults (recorded in .copier-answers.yml):\n  license: MIT\n" in result.stdout
    assert answers(project)["license"] == "MIT"


def test_rename_keeps_every_edit_and_later_updates_follow_the_new_name(tmp_path, install):
    install(V1)
    project = new_project(tmp_path / "proj")
    filled = edit_like_a_user(project)
    (project / "src" / "proj" / "mine.py").write_text("from proj.model import build_model\n\nENTRY = 'proj.train'\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "My module")
    refused = looptpl("rename", "json", str(project))
    assert refused.exit_code == 2 and "would shadow the module 'json'" in refused.stderr
    assert git(project, "status", "--porcelain") == ""

    result = looptpl("rename", "vision", str(project))
    assert result.exit_code == 0, result.stderr
    package = project / "src" / "vision"
    assert not (project / "src" / "proj").exists() and answers(project)["package_name"] == "vision"
    for path, text in filled.items():  # yours, moved as they are: they import their siblings relatively
        assert (package / path.name).read_text() == text
    assert USER_ENGINE_NOTE in (package / "train.py").read_text()
    assert (package / "mine.py").read_text() == "from vision.model import build_model\n\nENTRY = 'vision.train'\n"
    assert "from vision.kit.ema import" in (project / "tests" / "test_ema.py").read_text()  # the template's files too
    readme = (project / "README.md").read_text()
    assert "python -m vision.train" in readme and USER_README_LINE in readme
    assert "README.md:1: # proj" in result.stdout  # the project's name, not the package's: shown, left to the user
    git(project, "add", "-A")
    git(project, "commit", "-qm", "Rename the package")

    install(V2)
    updated = looptpl("update", str(project))
    assert updated.exit_code == 0, (updated.stdout, updated.stderr)
    assert ENGINE_FIX in (package / "train.py").read_text() and (package / "notes.py").is_file()
    assert not (project / "src" / "proj").exists()  # no stray package under the old name
    train = [sys.executable, "-m", "vision.train", "--device", "cpu", "--no-progress", "--epochs", "1"]
    environment = {**os.environ, "PYTHONPATH": str(project / "src")}
    trained = run([*train, "--run-dir", str(tmp_path / "run")], cwd=project, env=environment, preload=TORCH)
    assert trained.returncode == 0, trained.stdout[-3000:]


def test_an_edit_to_code_the_template_moved_is_named_with_where_the_code_went(tmp_path, install):
    # v1.1.0 of this template moves make_autocast from kit/models.py to kit/precision.py; the user had edited it,
    # and copier alone would leave that edit where the function used to be.
    install(V1)
    project = new_project(tmp_path / "proj")
    step = project / "src" / "proj" / "kit" / "models.py"
    step.write_text(step.read_text().replace("    if dtype is None:", "    if dtype is None:  # mine: fp32 on CPUs"))
    git(project, "commit", "-qam", "My autocast")
    edited = step.read_text().splitlines().index("    if dtype is None:  # mine: fp32 on CPUs") + 1
    install(V2, tagged_repository(tmp_path / "moving-template", move_make_autocast))
    for dry_run in (["--dry-run"], []):
        result = looptpl("update", str(project), *dry_run)
        assert result.exit_code == 3, (result.stdout, result.stderr)
        if not dry_run:  # the line in the merged file, where the user now finds the edit (markers around it)
            lines = step.read_text().splitlines()
            assert edited != (edited := lines.index("    if dtype is None:  # mine: fp32 on CPUs") + 1)
        assert (
            f"src/proj/kit/models.py line {edited}: that template code is now in src/proj/kit/precision.py"
            in result.stdout
        )
        assert "need attention: src/proj/kit/models.py" in result.stderr


def test_a_dry_run_suggests_the_update_with_the_same_options(tmp_path, install):
    options = ["--strategy", "ddp", "--conflict", "rej"]
    install(V1)
    project = new_project(tmp_path / "my projects" / "proj")  # a space: the command must quote the path
    preview = looptpl("update", str(project), "--dry-run", *options)
    assert preview.exit_code == 0, preview.stderr
    command = re.search(r"Run `(.*)` to apply\.", preview.stdout)
    assert command is not None, preview.stdout
    assert command[1] == shlex.join(["looptpl", "update", str(project), *options])
    assert git(project, "status", "--porcelain") == ""
    result = looptpl(*shlex.split(command[1])[1:])  # what the dry run said to run does what it previewed
    assert result.exit_code == 0, result.stderr
    assert answers(project)["strategy"] == "ddp"


def test_a_project_named_like_what_a_tracker_imports_still_renames_away(tmp_path, install):
    # `looptpl new` refuses such a name now; a project an older looptpl made with one can still rename to a good one.
    install(V1)
    project = new_project(tmp_path / "proj")
    git(project, "mv", "src/proj", "src/click")
    rewrite_answers(project, package_name="click")
    result = looptpl("rename", "vision", str(project))
    assert result.exit_code != 2, result.stderr  # not refused (its files, which still say proj, clash: exit 3)
    assert answers(project)["package_name"] == "vision" and (project / "src" / "vision" / "train.py").is_file()


# The last release made before the template's machinery moved into src/PKG/kit/ (#30).
BEFORE_KIT = "5a090a1"


def release_then_this_checkout(root: Path, commit: str) -> Path:
    """A template repository tagged v1.0.0 (this repository's template at `commit`) and v1.1.0 (this checkout's)."""

    def release(root: Path) -> None:
        root.mkdir(parents=True)
        archive = root.parent / f"{commit}.tar"
        files = ["copier.yml", "templates"]
        subprocess.run(["git", "archive", "-o", str(archive), commit, *files], cwd=REPO_ROOT, check=True)
        subprocess.run(["tar", "-xf", str(archive), "-C", str(root)], check=True)

    def this_checkout(root: Path) -> None:
        shutil.rmtree(root / "templates")
        copy_template(root)

    return tagged_repository(root, this_checkout, first=release)


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["looptpl", "copier"])
def test_a_project_made_before_the_kit_layout_updates_to_it_and_trains(tmp_path, install, tool):
    known = subprocess.run(["git", "cat-file", "-e", f"{BEFORE_KIT}^{{commit}}"], cwd=REPO_ROOT, check=False)
    if known.returncode != 0:
        pytest.skip(f"this clone lacks the history back to {BEFORE_KIT}")
    repository = release_then_this_checkout(tmp_path / "template", BEFORE_KIT)
    project = tmp_path / "proj"
    if tool == "looptpl":
        install(V1, repository)
        new_project(project, strategy="ddp")
    else:
        copy = [sys.executable, "-m", "copier", "copy", "--defaults", "--vcs-ref", V1, "-d", "project_name=proj"]
        assert run([*copy, "-d", "strategy=ddp", str(repository), str(project)], cwd=tmp_path).returncode == 0
        for command in (["init", "-q"], ["add", "--all"], ["commit", "-qm", "Generate"]):
            git(project, *command)
    package = project / "src" / "proj"
    assert (package / "engine.py").is_file() and "from .collect import" in (package / "step.py").read_text()
    filled = {}
    for name in USER_FILES:  # filled in, keeping the imports of their day (`from .collect import Mean`)
        path = package / f"{name}.py"
        path.write_text(
            path.read_text().replace("# TODO(", "# DONE(") + f'\n\ndef my_{name}() -> str:\n    return "mine"\n'
        )
        filled[path] = path.read_text()
    git(project, "commit", "-qam", "Fill the TODOs")

    if tool == "looptpl":
        install(V2, repository)
        result = looptpl("update", str(project))
        assert result.exit_code == 0, (result.stdout, result.stderr)
    else:
        result = run([sys.executable, "-m", "copier", "update", "--defaults"], cwd=project, timeout=300)
        assert result.returncode == 0, result.stdout
    for path, text in filled.items():
        assert path.read_text() == text, f"{path.name} is yours and must not change"
    # The template's modules moved into kit/, without leftovers beside the reading path.
    assert {path.name for path in package.glob("*.py")} == {f"{name}.py" for name in USER_FILES} | {
        "__init__.py",
        "train.py",
        "distributed.py",
    }
    assert (package / "kit" / "checkpoint.py").is_file() and not list(project.rglob("*.rej"))
    assert not (package / "kit" / "sharded.py").exists()  # FSDP's checkpoints: fsdp projects only
    env = {"PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    train = [sys.executable, "-m", "proj.train", "--epochs", "1", "--device", "cpu", "--no-progress"]
    trained = run([*train, "--run-dir", str(tmp_path / "run")], cwd=project, timeout=600, env=env, preload=TORCH)
    assert trained.returncode == 0 and "test_loss" in trained.stdout, trained.stdout[-5000:]


# The last release before the step/metrics contract: metrics.py held per_sample_metrics, and there was no
# step.py; the loop of today calls metrics.py's dataset_metrics, and today's step.py imports batch_metrics.
BEFORE_STEP_CONTRACT = "e989a35"


@pytest.mark.slow
@pytest.mark.parametrize("backend,strategy", [("torch", "ddp"), ("tensorflow", "mirrored")])
def test_an_update_across_a_contract_change_names_what_your_files_now_need(tmp_path, install, backend, strategy):
    known = subprocess.run(["git", "cat-file", "-e", f"{BEFORE_STEP_CONTRACT}^{{commit}}"], cwd=REPO_ROOT, check=False)
    if known.returncode != 0:
        pytest.skip(f"this clone lacks the history back to {BEFORE_STEP_CONTRACT}")
    repository = release_then_this_checkout(tmp_path / "template", BEFORE_STEP_CONTRACT)
    install(V1, repository)
    project = tmp_path / "proj"
    assert looptpl("new", str(project), "--backend", backend, "--strategy", strategy).exit_code == 0
    package = project / "src" / "proj"
    metrics = package / "metrics.py"
    metrics.write_text(metrics.read_text().replace("# TODO(metrics)", "# DONE(metrics)"))  # the user's own
    git(project, "commit", "-qam", "My metrics")
    mine = metrics.read_text()
    env = {"PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    train = [sys.executable, "-m", "proj.train", "--epochs", "1", "--no-progress", "--run-dir", str(tmp_path / "run")]
    # A run of the old template, with its checkpoint, to resume after the update.
    old = [*train[:-1], str(tmp_path / "old"), "--epochs", "2", "--stop-after-epoch", "1"]
    preload = TORCH if backend == "torch" else TENSORFLOW  # the runs start forked, as the projects' tests start theirs
    assert run(old, cwd=project, timeout=300, env=env, preload=preload).returncode == 0

    install(V2, repository)
    result = looptpl("update", str(project))
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert metrics.read_text() == mine  # yours: the update says what it needs, and changes nothing
    needs = [
        "metrics.py: defines no dataset_metrics(means, gathered), which the loop calls; add it "
        "(see docs/todos.md#losspy-and-metricspy)",
        "step.py:",  # today's step.py (new to this project) imports batch_metrics from metrics.py
    ]
    listed = result.stdout[result.stdout.index("Your files lack what the new loop calls") :]
    assert all(need in listed for need in needs), listed
    assert "need attention: " in result.stderr and "metrics.py" in result.stderr
    # The template's new metrics.py merged into the user's edited copy, beside it, for the user to take.
    assert "dataset_metrics" in (package / "metrics.py.merged").read_text()
    git(project, "add", "-A")
    git(project, "commit", "-qm", "Update")
    # Training, the project's tests and `looptpl check` say the same, one line each, before anything runs.
    trained = run(train, cwd=project, timeout=300, env=env, preload=preload)
    assert trained.returncode == 1 and "Traceback" not in trained.stdout
    assert all(f"error: {need}" in trained.stdout for need in needs), trained.stdout
    if backend == "torch":  # (the TensorFlow conftest runs the same check, in the same words)
        tests = run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"], cwd=project, timeout=300)
        assert tests.returncode == 1 and "Traceback" not in tests.stdout
        assert all(f"error: {need}" in tests.stdout for need in needs), tests.stdout
    checked = looptpl("check", str(project))
    assert checked.exit_code == 3 and all(f"error: {need}" in checked.stderr for need in needs)

    # The port the docs show: today's metrics.py functions (and, for TensorFlow, data.py's make_batches).
    fresh = tmp_path / "fresh"
    assert looptpl("new", str(fresh), "--backend", backend, "--strategy", strategy, "--no-git").exit_code == 0
    ported = ["metrics.py", "data.py"] if backend == "tensorflow" else ["metrics.py"]
    for name in ported:
        shutil.copy(fresh / "src" / "fresh" / name, package / name)
        edit = (package / name).read_text().replace("from fresh.", "from proj.")
        (package / name).write_text(edit)
    assert looptpl("check", str(project)).exit_code == 0
    # The project trains again, and its own tests start (the contract check in conftest passes; the whole
    # suite of today's template runs in test_all_variants_pass_their_own_tests.py).
    trained, own = in_parallel(
        lambda: run(train, cwd=project, timeout=300, env=env, preload=preload),
        lambda: run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_no_conflict_markers.py"],
            cwd=project,
            timeout=300,
        ),
    )
    assert trained.returncode == 0 and "test_loss" in trained.stdout, trained.stdout[-3000:]
    assert own.returncode == 0 and "2 passed" in own.stdout, own.stdout[-3000:]
    # The old run's checkpoint is of the old format: refused in one line that blames neither your files nor
    # the disk, and left where it is.
    resumed = run([*old[:-4], "--epochs", "2", "--resume"], cwd=project, timeout=300, env=env, preload=preload)
    assert resumed.returncode != 0 and "Traceback" not in resumed.stdout, resumed.stdout
    newest = "epoch-0001.pt" if backend == "torch" else "epoch-1"
    assert f"{newest} was written by an older version of the template (it holds no " in resumed.stdout
    assert (tmp_path / "old" / "checkpoints" / newest).exists() or list((tmp_path / "old").rglob(f"{newest}.index"))
