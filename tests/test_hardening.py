"""Issue #15 on the generator: no write outside DEST, no traceback for a user's mistake, nothing left behind.

Each case is what a careless or hostile user tried; each test failed before its fix.
"""

import errno
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
from conftest import answers, looptpl, stop_forked_runs
from test_update import V1, V2, git, install, isolated, new_project, template_repo  # noqa: F401 (fixtures)

from looptpl import render, signals
from looptpl.errors import LooptplError


def one_line_error(result, message: str, code: int = 2) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr, result.stderr


def listing(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def test_a_dest_ending_in_dotdot_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    (tmp_path / "mine.txt").write_text("the user's own file")
    monkeypatch.chdir(tmp_path)
    result = looptpl("new", "nope/..", "--defaults")
    one_line_error(result, "DEST nope/.. goes up with '..' through a folder that does not exist")
    assert listing(tmp_path) == ["mine.txt"]  # no project, no `git init`, no stray nope/


def test_a_dest_through_an_existing_folder_and_back_is_that_folder(tmp_path, monkeypatch):
    (tmp_path / "there").mkdir()
    monkeypatch.chdir(tmp_path)
    assert looptpl("new", "there/../proj", "--defaults", "--no-git").exit_code == 0
    assert (tmp_path / "proj" / "src" / "proj" / "train.py").is_file()


def test_new_dot_in_an_empty_folder_fills_it_and_keeps_the_folder(tmp_path, monkeypatch):
    folder = tmp_path / "empty-one"
    folder.mkdir()
    monkeypatch.chdir(folder)
    result = looptpl("new", ".", "--defaults")
    assert result.exit_code == 0, result.stderr
    assert answers(folder)["project_name"] == "empty-one"
    assert (folder / ".git").is_dir() and (folder / "src" / "empty_one" / "train.py").is_file()
    assert not [path for path in folder.iterdir() if path.name.startswith(".looptpl-")]
    assert Path.cwd().samefile(folder)  # the folder itself was kept, not replaced under the user's shell


def test_an_empty_dest_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(looptpl("new", "", "--defaults"), "DEST is empty; name the project's folder")
    assert listing(tmp_path) == []


def test_a_dest_that_links_to_an_empty_folder_fills_the_folder(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert looptpl("new", str(tmp_path / "link"), "--defaults", "--no-git").exit_code == 0
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "pyproject.toml").is_file()


def test_a_dangling_link_is_refused_and_its_target_not_created(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere" / "target")
    result = looptpl("new", str(tmp_path / "link"), "--defaults")
    one_line_error(result, f"is a symbolic link to {tmp_path / 'elsewhere' / 'target'}, which does not exist")
    assert listing(tmp_path) == ["link"]


def test_over_long_dest_names_are_one_line(tmp_path):
    one_line_error(looptpl("new", str(tmp_path / ("a" * 300)), "--defaults"), "a folder name of 300 bytes")
    deep = tmp_path / "/".join(["abcdefghij"] * 400)
    one_line_error(looptpl("new", str(deep), "--defaults"), "choose a shorter path")
    assert listing(tmp_path) == []


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    real_copy = render._copier_copy

    def fills_the_disk(project, answers, scratch):
        real_copy(project, answers, scratch)
        raise OSError(errno.ENOSPC, "No space left on device", str(project / "src"))

    monkeypatch.setattr(render, "_copier_copy", fills_the_disk)
    result = looptpl("new", str(tmp_path / "a" / "proj"), "--defaults")
    one_line_error(result, "No space left on device", code=1)
    assert "free some space and retry" in result.stderr
    assert listing(tmp_path) == []  # the folders created for DEST are gone too


def test_the_loser_of_two_runs_into_one_dest_takes_nothing_away(tmp_path, monkeypatch):
    destination = tmp_path / "proj"
    real_copy = render._copier_copy

    def another_run_wins_meanwhile(project, answers, scratch):
        real_copy(project, answers, scratch)
        (destination / "README.md").write_text("the winner's project")

    monkeypatch.setattr(render, "_copier_copy", another_run_wins_meanwhile)
    result = looptpl("new", str(destination), "--defaults")
    one_line_error(result, "was filled by another process while this project was rendered", code=1)
    assert listing(destination) == ["README.md"] and (destination / "README.md").read_text() == "the winner's project"


def test_two_concurrent_runs_make_one_project_and_one_clear_refusal(tmp_path):
    command = [sys.executable, "-m", "looptpl", "new", "proj", "--defaults"]
    env = {**os.environ, "LOOPTPL_HOME": str(tmp_path / "home")}
    runs = [subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(run.wait(timeout=120), run.stderr.read()) for run in runs]  # type: ignore[union-attr]
    assert sorted(code for code, _ in results) in ([0, 1], [0, 2]), results
    loser = next(error for code, error in results if code)
    assert loser.startswith("error: ") and len(loser.strip().splitlines()) == 1, loser
    project = tmp_path / "proj"
    assert not [path for path in project.iterdir() if path.name.startswith(".looptpl-")]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True)
    assert status.stdout == ""  # one whole project, committed


def test_a_leftover_staging_folder_is_named_in_the_refusal(tmp_path):
    (tmp_path / "proj" / ".looptpl-abc123").mkdir(parents=True)
    result = looptpl("new", str(tmp_path / "proj"), "--defaults")
    one_line_error(result, "holds only looptpl's temporary folders (.looptpl-abc123)")


def test_an_error_inside_rendering_is_not_a_traceback(tmp_path, monkeypatch):
    def broken(project, answers, scratch):
        raise LooptplError("the template could not be rendered: boom", exit_code=1)

    monkeypatch.setattr(render, "_copier_copy", broken)
    one_line_error(looptpl("new", str(tmp_path / "proj"), "--defaults"), "boom", code=1)
    assert listing(tmp_path) == []


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("delay", [0.1, 0.3, 0.6, 0.9])
def test_a_signal_during_new_is_one_line_and_leaves_nothing(tmp_path, name, delay):
    """Ctrl-C or SIGTERM at any moment: no traceback, no staging folder, no copier clone in TMPDIR."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "LOOPTPL_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "looptpl", "new", "proj", "--defaults"]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(delay)
    process.send_signal(getattr(signal, name))
    stdout, stderr = process.communicate(timeout=120)
    assert list(scratch.iterdir()) == []
    if process.returncode == 0:  # it finished first
        assert "Created proj" in stdout
        return
    if process.returncode == -getattr(signal, name):
        pass  # on a loaded machine the signal may come while Python itself starts, before any looptpl code
    else:
        assert process.returncode == 128 + getattr(signal, name), (stdout, stderr)
        assert stderr == "error: cancelled; nothing was written\n"
    assert sorted(path.name for path in tmp_path.iterdir()) in (["home", "tmp"], ["tmp"]), listing(tmp_path)


@pytest.fixture
def cancellable(monkeypatch):
    """looptpl's own SIGINT/SIGTERM handlers in this process, as the `looptpl` script installs them; with no
    forked-runs server of an earlier test left as a child, which a cancellation would wait 30 s for."""
    stop_forked_runs()
    handlers = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    for name in ("cancelled", "exit_code", "_deferring", "_finished"):  # install() sets them: restored after
        monkeypatch.setattr(signals, name, getattr(signals, name))
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    signals.install()
    yield
    for each, handler in handlers.items():
        signal.signal(each, handler)


def signalled_after(function, when, sent):
    """`function`, sending this process a SIGTERM right after a call that `when(*args)` picks has returned.

    Each signal sent is appended to `sent`, so a test knows the moment it aims at came at all.
    """

    def wrapped(*args, **kwargs):
        result = function(*args, **kwargs)
        if when(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            sent.append(function.__name__)
        return result

    return wrapped


def goes_on_after_the_signal(action: str, done: Path) -> None:
    """Start a child that runs the Python `action` half a second from now, as the git copier started goes on
    after looptpl's Ctrl-C, then creates `done`."""
    code = f"import os, sys, time; time.sleep(0.5); {action}; open(sys.argv[1], 'w').close()"
    subprocess.Popen([sys.executable, "-c", code, str(done)])


def waited_for(path: Path) -> bool:
    """Whether `path` exists within 30 s."""
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


@pytest.mark.parametrize("moment", ["making DEST", "making the staging folder", "moving the first entry in"])
def test_a_signal_right_after_a_folder_is_made_or_moved_still_leaves_nothing(
    tmp_path, monkeypatch, cancellable, moment
):
    """The signal lands between a write and the note that lets the cleanup undo it (deterministically here)."""
    destination, sent = tmp_path / "deep" / "proj", []
    if moment == "making DEST":
        made = signalled_after(Path.mkdir, lambda path, *_, **__: path == destination, sent)
        monkeypatch.setattr(Path, "mkdir", made)
    elif moment == "making the staging folder":
        monkeypatch.setattr(
            render.tempfile, "mkdtemp", signalled_after(render.tempfile.mkdtemp, lambda **_: True, sent)
        )
    else:
        monkeypatch.setattr(render.os, "rename", signalled_after(render.os.rename, lambda *_: True, sent))
    result = looptpl("new", str(destination), "--defaults")
    assert sent, "the signal was never sent: the moment this test aims at did not come"
    one_line_error(result, "cancelled; nothing was written", code=128 + signal.SIGTERM)
    assert listing(tmp_path) == []


def test_a_signal_then_a_failure_in_the_same_step_is_reported_as_the_cancellation(tmp_path, monkeypatch, cancellable):
    """Ctrl-C, then a full disk before the step could end: the user pressed Ctrl-C, so that is what is said."""

    def full_disk(**_):
        os.kill(os.getpid(), signal.SIGTERM)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(render.tempfile, "mkdtemp", full_disk)
    result = looptpl("new", str(tmp_path / "proj"), "--defaults")
    one_line_error(result, "cancelled; nothing was written", code=128 + signal.SIGTERM)
    assert listing(tmp_path) == []


class ModuleLock:
    """Stands for importlib's module lock: a weakref callback runs when one dies."""


def test_a_signal_inside_a_weakref_callback_still_cancels_in_one_line(tmp_path, monkeypatch, cancellable):
    """Python cannot raise out of a weakref callback (importlib runs one for its module locks while a module
    imports, CI caught a SIGTERM there): the signal is not printed as "Exception ignored" and lost, it cancels."""
    sent = []

    def copier_importing(project, answers, scratch):
        def lock_released(_):
            sent.append("SIGTERM")
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, inside the callback

        held = weakref.ref(ModuleLock(), lock_released)  # the lock dies at once and the callback runs
        time.sleep(10)  # cancelled before this ends
        del held

    monkeypatch.setattr(render, "_copier_copy", copier_importing)
    started = time.monotonic()
    result = looptpl("new", str(tmp_path / "proj"), "--defaults")
    assert sent, "the callback never ran"
    one_line_error(result, "cancelled; nothing was written", code=128 + signal.SIGTERM)
    assert time.monotonic() - started < 5 and listing(tmp_path) == []


def test_a_signal_while_copier_runs_git_waits_for_that_git_before_cleaning_up(tmp_path, monkeypatch, cancellable):
    """The signal reaches looptpl, not the git copier started: that git goes on writing (here 0.5 s later) and
    would recreate the staging folder, DEST with it, after the cleanup, unless looptpl waits for it first."""
    work, done = tmp_path / "work", tmp_path / "git-done"

    def copier_running_git(project, answers, scratch):
        goes_on_after_the_signal(f"os.makedirs({str(scratch / 'clone' / '.git' / 'objects')!r})", done)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # cancelled before this ends

    monkeypatch.setattr(render, "_copier_copy", copier_running_git)
    result = looptpl("new", str(work / "proj"), "--defaults")
    one_line_error(result, "cancelled; nothing was written", code=128 + signal.SIGTERM)
    assert waited_for(done) and listing(work) == []


def test_a_signal_once_the_project_is_in_place_keeps_it_and_says_so(tmp_path, monkeypatch, cancellable):
    """Past the last move nothing is taken back, so the command must not claim that nothing was written."""
    sent = []
    monkeypatch.setattr(signals, "finished", signalled_after(signals.finished, lambda: True, sent))
    result = looptpl("new", str(tmp_path / "proj"), "--defaults")
    assert sent, "finished() was never called"
    assert result.exit_code == 0 and result.stdout.startswith("Created "), (result.stdout, result.stderr)
    assert (tmp_path / "proj" / "src" / "proj" / "train.py").is_file()


# --- looptpl update: what copier would silently skip (#15 item 5) --------------------------------


def head(project: Path) -> str:
    return git(project, "rev-parse", "HEAD").strip()


@pytest.fixture
def generated(tmp_path, install) -> Path:  # noqa: F811 (the imported fixture)
    """A project generated at v1.0.0, with looptpl then at v1.1.0 (a template fix to merge)."""
    install(V1)
    project = new_project(tmp_path / "proj")
    install(V2)
    return project


def test_update_after_renaming_the_package_folder_is_refused(generated):
    git(generated, "mv", "src/proj", "src/renamed")
    git(generated, "commit", "-qm", "Rename the package")
    before = head(generated)
    result = looptpl("update", str(generated))
    one_line_error(result, "src/renamed/ holds the project: an update cannot follow a renamed package")
    assert "git mv src/renamed src/proj" in result.stderr
    assert head(generated) == before and git(generated, "status", "--porcelain") == ""


def test_update_after_editing_package_name_in_the_answers_is_refused(generated):
    answers_file = generated / ".copier-answers.yml"
    answers_file.write_text(answers_file.read_text().replace("package_name: proj", "package_name: other"))
    git(generated, "commit", "-qam", "Edit the answers")
    result = looptpl("update", str(generated))
    one_line_error(result, "package_name in .copier-answers.yml was changed by hand from proj to other")
    assert git(generated, "status", "--porcelain") == ""


def test_update_names_a_deleted_engine_file_it_left_deleted(generated):
    git(generated, "rm", "-q", "src/proj/train.py")
    git(generated, "commit", "-qm", "Delete the engine")
    result = looptpl("update", str(generated))
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "You deleted these generated files, so the update left them deleted" in result.stdout
    assert "  src/proj/train.py" in result.stdout
    assert "need attention: src/proj/train.py" in result.stderr
    assert answers(generated)["_commit"] == V2  # the rest was merged


def test_a_signal_while_copier_merges_waits_for_its_git_before_putting_the_project_back(
    generated, monkeypatch, cancellable
):
    """Ctrl-C during the merge: the git copier started goes on (here writing 0.5 s later); the project is put
    back only once it has ended, so nothing of the half-done merge is left."""
    import copier

    done = generated.parent / "git-done"

    def merging(project, **_):
        goes_on_after_the_signal(f"open({str(project / 'README.md')!r}, 'a').write('merged')", done)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # cancelled before this ends

    monkeypatch.setattr(copier, "run_update", merging)
    before = head(generated)
    result = looptpl("update", str(generated))
    one_line_error(result, "cancelled; the project was left as it was", code=128 + signal.SIGTERM)
    assert waited_for(done) and head(generated) == before
    assert git(generated, "status", "--porcelain") == ""


def test_update_with_a_non_text_description_in_the_answers_is_one_line(generated):
    answers_file = generated / ".copier-answers.yml"
    text = answers_file.read_text()
    answers_file.write_text(text.replace(f"description: {answers(generated)['description']}", "description: [1, 2]"))
    git(generated, "commit", "-qam", "Edit the answers")
    result = looptpl("update", str(generated))
    one_line_error(result, "the description must be text, not list")


# --- Issue #31: nothing lost, nothing silently wrong -------------------------------------------------------


def link_out(project: Path, name: str, outside: Path) -> Path:
    """Move the project's `name` (a file or a folder) to `outside` and track a symbolic link to it instead."""
    outside.parent.mkdir(parents=True, exist_ok=True)
    (project / name).rename(outside)
    (project / name).symlink_to(outside)
    git(project, "add", "-A")
    git(project, "commit", "-qm", f"Share {name}")
    return outside


def contents(path: Path) -> dict[str, bytes]:
    files = [path] if path.is_file() else sorted(path.rglob("*"))
    return {str(file): file.read_bytes() for file in files if file.is_file()}


# A user's own module that imports the package, a file the template renders, a folder of them.
LINKED = {"user module": "src/proj/mine.py", "rendered file": "README.md", "rendered folder": "tests"}


@pytest.mark.parametrize("case", LINKED)
def test_rename_writes_nothing_through_a_symbolic_link(generated, case):
    name = LINKED[case]
    if case == "user module":
        (generated / name).write_text("from proj.model import build_model\n")
    outside = link_out(generated, name, generated.parent / "shared" / Path(name).name)
    before, head_before = contents(outside), head(generated)
    result = looptpl("rename", "vision", str(generated))
    one_line_error(result, f"{name} is a symbolic link (to {outside})")
    assert "replace the link with a copy of what it points to" in result.stderr
    assert contents(outside) == before  # `git reset --hard` could not have undone a write there
    assert head(generated) == head_before and git(generated, "status", "--porcelain") == ""


@pytest.mark.parametrize("name", ["src/proj/train.py", "tests"])
def test_update_refuses_a_symbolic_link_where_the_template_writes(generated, name):
    # copier would drop v1.1.0's engine fix without a word (the link is put back), or fail on the folder.
    outside = link_out(generated, name, generated.parent / "shared" / Path(name).name)
    before, head_before = contents(outside), head(generated)
    for dry_run in (["--dry-run"], []):
        result = looptpl("update", str(generated), *dry_run)
        one_line_error(result, f"{name} is a symbolic link (to {outside})")
    assert contents(outside) == before
    assert head(generated) == head_before and git(generated, "status", "--porcelain") == ""


def test_an_update_with_committed_conflict_markers_is_refused(generated):
    """Markers committed from an earlier update would get nested inside the next merge's markers."""
    engine = generated / "src" / "proj" / "train.py"
    engine.write_text(f"<<<<<<< before updating\nmine\n=======\ntheirs\n>>>>>>> after updating\n{engine.read_text()}")
    (generated / "README.md.rej").write_text("@@ -1 +1 @@\n-a\n+b\n")
    git(generated, "add", "-A")
    git(generated, "commit", "-qm", "Half-finished update")
    before = head(generated)
    for dry_run in (["--dry-run"], []):
        result = looptpl("update", str(generated), *dry_run)
        one_line_error(
            result,
            "still holds an earlier update's conflict markers or .rej file (README.md, src/proj/train.py); "
            "resolve them (keep what you need of each side and delete the marker lines, or apply the .rej by "
            "hand and delete it), commit, then update",
        )
    assert head(generated) == before and git(generated, "status", "--porcelain") == ""
    assert answers(generated)["_commit"] == V1
