"""Issue #31: mistakes a generated project refuses at start-up, in a --config file, in a flag or in a user file.

Each is one line that names the file (and the key, or the line) and the fix, with no usage block and
no traceback, before any training. One project is rendered per backend; its cases run in one Python
process (`DRIVER`: the framework is imported once, the project's own package afresh for each case),
and a real `python -m PKG.train` (torchrun's two ranks for torch) checks the exit and the output of
a process. Each test failed before its fix.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import in_parallel, looptpl, run

# One variant per backend: ddp also starts under torchrun, one-device is TensorFlow's quickest.
VARIANTS = [("torch", "ddp"), ("tensorflow", "one-device")]

# Runs every case of cases.json in this one process and writes what each printed and its exit status.
# A case's argv goes to train.main(), after its sources are imported afresh, as `python -m PKG.train`
# would; an exception ends it as it would end Python (sys.exit("...") prints its text and exits 1).
DRIVER = """
import contextlib, importlib, io, json, sys, traceback

package, cases_file, results_file = sys.argv[1:]
results = {}
for name, case in json.loads(open(cases_file).read()).items():
    for loaded in [module for module in sys.modules if module == package or module.startswith(package + ".")]:
        del sys.modules[loaded]
    sys.path.insert(0, case["sources"])
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            code = importlib.import_module(package + ".train").main(case["argv"])
        except SystemExit as exit:
            code = exit.code
            if isinstance(code, str):
                print(code)
                code = 1
        except Exception:
            traceback.print_exc()
            code = 1
    sys.path.remove(case["sources"])
    results[name] = {"code": code, "output": output.getvalue()}
open(results_file, "w").write(json.dumps(results))
"""

BIG = "1" + "0" * 400  # past any float, and past TOML's 64-bit integers

# name: (the config file's bytes, the message naming it as {path}). Each run also names a --run-dir inside
# a file, so a value that gets through is refused right after (and nothing trains).
CONFIG_FILES = {
    "not_utf8": (b'epochs = 3\nmonitor = "caf\xe9"\n', "--config {path}: line 2 is not UTF-8 text (byte 0xe9)"),
    "float_overflow": (b"lr = 1e400\n", "{path}: lr must be a finite number, got inf"),
    "huge_integer_for_a_float": (f"lr = {BIG}\n".encode(), "{path}: lr is too large for a float"),
    "huge_integer": (f"epochs = {BIG}\n".encode(), "{path}: epochs is past the range of TOML's 64-bit integers"),
    "nul_character": (b'monitor = "val\\u0000loss"\n', "{path}: monitor holds a NUL character"),
    "out_of_range": (b"epochs = -1\n", "{path}: epochs must be at least 1, got -1"),
    "spelled_with_dashes": (b"global-batch-size = 0\n", "{path}: global-batch-size must be at least 1, got 0"),
}

# name: (user file, the line appended to it, the message; {line} is the appended line's number).
USER_FILES = {
    "model_syntax": ("model.py", "def broken(:", "model.py:{line}: SyntaxError: invalid syntax; fix this line"),
    "settings_syntax": ("settings.py", "DEFAULTS = {", "settings.py:{line}: SyntaxError: '{{' was never closed"),
    "hooks_indentation": ("hooks.py", "  stray = 1", "hooks.py:{line}: IndentationError: unindent does not match"),
    "data_name_error": ("data.py", "undefined", "data.py:{line} failed on import: NameError: name 'undefined' is"),
    "model_name_gone": ("model.py", "del build_model", "model.py: cannot import name 'build_model' from"),
}


class Startup(NamedTuple):
    project: Path
    root: Path  # the cases' files, and the current folder of their runs
    results: dict[str, dict]  # by case: what it printed ("output") and its exit status ("code")
    launched: subprocess.CompletedProcess  # the real process(es) with model_syntax's sources
    ranks: int  # processes the launch started


@pytest.fixture(scope="module", params=VARIANTS, ids=[strategy for _, strategy in VARIANTS])
def startup(request, tmp_path_factory):
    """The variant's project, and the output and exit status of every case, by name."""
    backend, strategy = request.param
    root = tmp_path_factory.mktemp(strategy)
    project = root / strategy.replace("-", "_")
    rendered = looptpl("new", str(project), "--backend", backend, "--strategy", strategy, "--defaults", "--no-git")
    assert rendered.exit_code == 0, rendered.stderr
    package = project.name
    (root / "a-file").write_text("")
    unwritable = ["--run-dir", str(root / "a-file" / "run")]
    cases = {}
    for name, (content, _) in CONFIG_FILES.items():
        (root / f"{name}.toml").write_bytes(content)
        cases[name] = {"argv": ["--config", str(root / f"{name}.toml"), *unwritable], "sources": str(project / "src")}
    # Before the fix these trained (one update, into the current folder): no run-dir to refuse them instead.
    (root / "empty_run_dir.toml").write_text('run_dir = ""\n')
    quick = ["--epochs", "1", "--max-steps", "1", "--no-progress"]
    cases["empty_run_dir_in_the_file"] = {
        "argv": ["--config", str(root / "empty_run_dir.toml"), *quick],
        "sources": str(project / "src"),
    }
    cases["empty_run_dir_flag"] = {"argv": ["--run-dir", "", *quick], "sources": str(project / "src")}
    for name, (file, line, _) in USER_FILES.items():
        sources = root / name
        shutil.copytree(project / "src", sources, ignore=shutil.ignore_patterns("__pycache__"))
        with (sources / package / file).open("a") as user_file:
            user_file.write(line + "\n")
        cases[name] = {"argv": unwritable, "sources": str(sources)}
    (root / "cases.json").write_text(json.dumps(cases))
    driver = [sys.executable, "-c", DRIVER, package, str(root / "cases.json"), str(root / "results.json")]
    # A real process beside the driver: torchrun's 2 ranks for torch, plain python for TensorFlow.
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"] if backend == "torch" else []
    process = [sys.executable, *launcher, "-m", f"{package}.train", *unwritable]
    environment = {"PYTHONPATH": str(root / "model_syntax"), "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    drove, launched = in_parallel(
        lambda: run(driver, cwd=root, timeout=240, env=environment),
        lambda: run(process, cwd=root, timeout=240, env=environment),
    )
    assert drove.returncode == 0, drove.stdout[-5000:]
    ranks = 2 if backend == "torch" else 1
    return Startup(project, root, json.loads((root / "results.json").read_text()), launched, ranks)


def one_line(result: dict, message: str, code: int = 2) -> None:
    """The case printed one line, `error: ...` holding `message`, and exited with `code`."""
    output = result["output"].strip()
    assert result["code"] == code and message in output, output[-3000:]
    assert output.startswith("error: ") and len(output.splitlines()) == 1, output[-3000:]


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_a_mistake_in_a_config_file_names_the_file_and_key_without_the_usage(startup, name):
    _, message = CONFIG_FILES[name]
    one_line(startup.results[name], message.format(path=startup.root / f"{name}.toml"))


def test_an_empty_run_dir_is_refused_from_a_file_and_from_the_command_line(startup):
    file = startup.root / "empty_run_dir.toml"
    one_line(startup.results["empty_run_dir_in_the_file"], f"{file}: run_dir is empty")
    one_line(startup.results["empty_run_dir_flag"], "--run-dir is empty")
    assert not (startup.root / "config.json").exists()  # nothing was written into the current folder


@pytest.mark.parametrize("name", USER_FILES)
def test_a_mistake_in_a_user_file_is_one_line_naming_it(startup, name):
    file, _, message = USER_FILES[name]
    line = len((startup.project / "src" / startup.project.name / file).read_text().splitlines()) + 1
    one_line(startup.results[name], message.format(line=line), code=1)


def test_a_syntax_error_stops_a_real_process_in_one_line_said_once(startup):
    package = startup.project.name
    line = len((startup.project / "src" / package / "model.py").read_text().splitlines()) + 1
    message = f"error: model.py:{line}: SyntaxError: invalid syntax; fix this line"
    output = startup.launched.stdout
    printed = [text for text in output.splitlines() if text.startswith(message)]
    assert startup.launched.returncode != 0 and len(printed) == 1, output[-5000:]  # by rank 0, not by every rank
    if startup.ranks > 1:  # and torchrun's closing summary quotes it, from the failed rank's error file (a rank
        # still starting when another failed may be stopped by torchrun first: SIGTERM, no error file of its own)
        assert f"traceback : {message}" in output, output[-5000:]
    # torchrun reports its failed ranks with a traceback of its own; the ranks print none.
    assert not re.search(rf'File "[^"]*/{package}/', output), output[-5000:]
    if startup.ranks == 1:
        assert "Traceback" not in output and output.strip().splitlines()[-1].startswith(message), output[-5000:]
