"""The user guide builds with `mkdocs build --strict`, and every command it shows is exercised.

Each command in a ```bash block of docs/*.md must match one rule below:

- RUN: cheap commands, run here as the docs write them. `looptpl new myproj ...` runs in a scratch
  folder; commands that need the project run against the one the quick start generates (or, for a
  TensorFlow command, a generated project of that strategy), with PYTHONPATH=src standing in for
  its editable install (which is itself run, into a throwaway virtual environment).
- COVERED: commands that cannot run here (GPUs, several machines, Slurm, a package index) or take
  minutes. Each names the test or file that runs the same thing, and that file must exist and
  contain the given text, so the mapping cannot silently go stale.
- `cd DIR`.

A command that matches no rule fails the test: a new command in the docs needs a rule here.
Flags given to the trainer, to torchrun or to launch.py in any command must exist, and the flags
page must list exactly the trainer's flags: the PyTorch ones, and those of each TensorFlow
strategy.
"""

import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run

DOCS = REPO_ROOT / "docs"
QUICK_START = "looptpl new myproj --backend torch --strategy ddp --defaults"
TF_STRATEGIES = ("one-device", "mirrored", "multi-worker")
# The projects a command can run in: the quick start's (torch), one per TensorFlow strategy, and JAX's mesh.
PROJECTS = {
    "torch": QUICK_START,
    **{
        strategy: f"looptpl new myproj --backend tensorflow --strategy {strategy} --defaults"
        for strategy in TF_STRATEGIES
    },
    "jax": "looptpl new myproj --backend jax --strategy data-parallel --defaults",
}
TRAIN_HELP = "python -m myproj.train --help"
TIMEOUT_S = 300
SEPARATORS = {"&&", "||", ";", "|"}
OTHER_SHELL_FENCES = re.compile(r"^[ \t]*```(sh|shell|console|zsh|bash-session)\b", re.MULTILINE)


@dataclass(frozen=True)
class Run:
    """A command this test runs: in `cwd` ("scratch", "project" or "repo"), expecting `expect` in its output.

    `project` names the generated project (a key of PROJECTS) that "project" and the flags check mean.
    """

    pattern: str
    cwd: str
    expect: str
    exit_code: int = 0
    project: str = "torch"


@dataclass(frozen=True)
class Covered:
    """A command run elsewhere: `path` (in this repository, or `myproj/...` in the generated project
    named by `project`) must contain every witness; with `flags_in_file`, also every `--flag` the
    command uses. `also` lists further places that must hold their witnesses (a command shared by
    the PyTorch and TensorFlow docs)."""

    pattern: str
    path: str
    witnesses: tuple[str, ...]
    why: str
    flags_in_file: bool = False
    project: str = "torch"
    also: tuple["Covered", ...] = ()


TRAIN = r"python -m myproj\.train"
RUN = (
    Run(r"looptpl list", "scratch", "fsdp"),
    Run(r"looptpl new myproj --backend torch --strategy (single|ddp|fsdp) --defaults", "scratch", "Created"),
    Run(r"looptpl new myproj --backend torch --strategy (single|ddp|fsdp) --defaults --dry-run", "scratch", "train.py"),
    Run(r"looptpl todo", "project", "TODOs left", exit_code=1),
    Run(r"pip install -e \.\[test\]", "project", ""),  # into a throwaway venv, see run_pip_install
    Run(rf"{TRAIN} --help", "project", "--global-batch-size"),
    Run(
        r"looptpl new myproj --backend tensorflow --strategy (one-device|mirrored|multi-worker) --defaults --dry-run",
        "scratch",
        "kit/stages.py",
    ),
    Run(rf"{TRAIN} --device cpu --epochs [1-3]", "scratch", "test_loss"),
    Run(rf"{TRAIN} --cpu-replicas 2 --epochs [1-3]", "scratch", "test_loss", project="mirrored"),
    Run(r"looptpl new myproj --backend jax --strategy (single|data-parallel|fsdp) --defaults", "scratch", "Created"),
    Run(rf"{TRAIN} --cpu-devices 2 --epochs [1-3]", "scratch", "test_loss", project="jax"),
    Run(
        r"python -m myproj\.kit\.launch --processes 2 -- --cpu-devices 1 --epochs [1-3]",
        "scratch",
        "test_loss",
        project="jax",
    ),
    Run(
        r"torchrun --standalone --nproc-per-node 2 -m myproj\.train --device cpu --epochs [1-3]", "scratch", "test_loss"
    ),
    Run(
        r"python bench/torch_loop\.py --skip-lightning --rounds 1 --warmup-epochs 0 --epochs 1 --train-size \d{1,4}",
        "repo",
        "generated / hand-written",
    ),
)

UPDATE_TESTS = "tests/test_update.py"
DISTRIBUTED_TESTS = "myproj/tests/test_distributed.py"
TRAINING_TESTS = "myproj/tests/test_training.py"
FAULT_TESTS = "myproj/tests/test_faults.py"  # TensorFlow multi-worker
COVERED = (
    Covered(
        r"pip install -e \.\[(wandb|mlflow)\]",
        "myproj/tests/test_trackers.py",
        ("def test_wandb_runs_offline_and_a_resumed_run_keeps_its_id", "def test_mlflow_logs_into_the_run_directory"),
        "needs a package index; the project's tests drive both trackers where they are installed",
    ),
    Covered(
        r"WANDB_MODE=offline python -m myproj\.train --tracker wandb",
        "myproj/tests/test_trackers.py",
        ('monkeypatch.setenv("WANDB_MODE", "offline")', '["--tracker", tracker'),
        "the project's tests log a run and its resumption to W&B offline, as the engine does",
    ),
    Covered(
        r"pip install( -U)? (\./looptpl|looptpl)",
        UPDATE_TESTS,
        ("def test_installed_wheel_upgrade_then_update", '"install"'),
        "a clone or a wheel, not an index: the test pip-installs looptpl wheels into a fresh virtual environment",
    ),
    Covered(
        r"pytest",
        "tests/test_all_variants_pass_their_own_tests.py",
        ("def test_generated_project_passes_its_own_tests", '"pytest"'),
        "minutes: the generated project's own test suite",
    ),
    Covered(
        TRAIN,
        "myproj/tests/conftest.py",
        ('"-m", "myproj.train"',),
        "picks a GPU when one is visible; the project's tests run the same entry point on the CPU",
    ),
    Covered(
        r"torchrun --standalone --nproc-per-node \d+ -m myproj\.train",
        "myproj/tests/conftest.py",
        ('"torch.distributed.run", "--standalone"',),
        "needs that many GPUs; the project's tests launch the same torchrun --standalone with 2 CPU ranks",
    ),
    Covered(
        r"torchrun --standalone --nproc-per-node \d+ -m myproj\.train --dist-timeout-s \d+",
        DISTRIBUTED_TESTS,
        ("def test_a_hung_rank_makes_the_others_fail_within_the_timeout", '"--dist-timeout-s"'),
        "needs GPUs; the test hangs a rank and checks that the others fail after --dist-timeout-s",
    ),
    Covered(
        r"torchrun --nnodes \d+ --nproc-per-node \d+ --rdzv-backend c10d --rdzv-endpoint HOST:\d+ --rdzv-id JOB "
        r"--max-restarts \d+ -m myproj\.train",
        DISTRIBUTED_TESTS,
        (
            "def test_two_nodes_train_like_one_node",
            '"--rdzv-backend=c10d"',
            "def test_a_killed_worker_restarts_and_ends_like_an_uninterrupted_run",
            '"--max-restarts"',
        ),
        "several machines; the tests start two torchrun agents on one c10d rendezvous, and kill a rank under "
        "--max-restarts",
    ),
    Covered(
        r"sbatch scripts/slurm\.sbatch( --[a-z-]+( \d+)?)*",
        DISTRIBUTED_TESTS,
        ("def test_the_slurm_script_starts_torchrun_on_every_node", '"slurm.sbatch"'),
        "needs Slurm; the tests run the script with stand-ins for srun and scontrol",
        also=(
            Covered(
                "",
                FAULT_TESTS,
                ("def test_the_slurm_script_restarts_the_workers_after_a_kill_while_saving", '"slurm.sbatch"'),
                "the TensorFlow multi-worker script, run with stand-ins for srun and scontrol",
                project="multi-worker",
            ),
            Covered(
                "",
                "tests/test_slurm_jax.py",
                (
                    "def test_the_slurm_script_joins_the_processes_and_restarts_them_after_a_kill",
                    '"scripts/slurm.sbatch"',
                ),
                "the JAX data-parallel script, run with stand-ins for srun and scontrol",
            ),
        ),
    ),
    Covered(
        r"CUDA_VISIBLE_DEVICES=[\d,]+ python -m myproj\.train",
        "myproj/tests/launcher.py",
        ('"--cpu-replicas", str(replicas)',),
        "needs GPUs; the project's tests run the same MirroredStrategy on 2 logical CPU devices",
        project="mirrored",
    ),
    Covered(
        r"export TF_CONFIG=\{.*\}",
        "myproj/src/myproj/kit/launch.py",
        ('"TF_CONFIG": tf_config(addresses, index)',),
        "several machines; launch.py gives each local worker such a TF_CONFIG, and the tests' workers get it too",
        project="multi-worker",
    ),
    Covered(
        rf"{TRAIN} --run-dir /shared/\S+",
        "myproj/tests/launcher.py",
        ("from myproj.kit.launch import worker_variables",),
        "several machines; the project's tests start two workers on one machine, as launch.py would",
        project="multi-worker",
    ),
    Covered(
        r"python -m myproj\.kit\.launch --workers \d+ -- --epochs \d+",
        FAULT_TESTS,
        ('"-m", "myproj.kit.launch", "--workers"',),
        "a two-worker run takes 20 s; the project's fault tests launch two workers the same way",
        project="multi-worker",
    ),
    Covered(
        r"python -m myproj\.kit\.launch --workers \d+ --max-restarts \d+ -- --epochs \d+",
        FAULT_TESTS,
        ("def test_a_killed_worker_restarts_and_ends_like_an_uninterrupted_run", '"--max-restarts"'),
        "the test kills a worker under launch.py --max-restarts and compares with an uninterrupted run",
        project="multi-worker",
    ),
    Covered(
        rf"{TRAIN} --epochs \d+ (--stop-after-epoch \d+|--resume)",
        "myproj/tests/test_resume.py",
        ("def test_resume_gives_the_same_result_as_an_uninterrupted_run", '"--stop-after-epoch"', '"--resume"'),
        "a long run; the test stops a run, resumes it and compares it with an uninterrupted one",
    ),
    Covered(
        rf"{TRAIN} --device cpu --epochs \d+ --precision (bf16|fp16)",
        TRAINING_TESTS,
        ("def test_mixed_precision_trains", '"--precision"'),
        "the project's test trains with bf16 and with fp16",
    ),
    Covered(
        r"python -m myproj\.kit\.plot runs(/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d)?",
        TRAINING_TESTS,
        ("def test_plot_writes_curves_or_explains_what_is_missing", '"myproj.kit.plot"'),
        "needs a finished run; the test trains, then plots it",
    ),
    Covered(
        r"python bench/torch_loop\.py( --[a-z-]+( \d+)?)*",
        "bench/torch_loop.py",
        ("def main",),
        "minutes of timing; the smoke command of the benchmarks page runs the same script here",
        flags_in_file=True,
    ),
    Covered(
        r"python bench/fsdp_checkpoint\.py( --[a-z-]+( \d+)?)*",
        "bench/fsdp_checkpoint.py",
        ("def main",),
        "a minute of timing with two ranks",
        flags_in_file=True,
    ),
    Covered(
        r"python -m myproj\.kit\.consolidate \S+ \S+( --weights-only)?",
        "templates/torch/tests/{% if strategy != 'single' %}test_distributed.py{% endif %}.jinja",
        ("def test_every_rank_writes_its_own_shards_and_consolidate_puts_them_together", '"--weights-only"'),
        "needs a sharded checkpoint from two fsdp ranks; the fsdp project's test writes one and consolidates it",
    ),
    Covered(
        r"looptpl check( \S+)?",
        UPDATE_TESTS,
        ('looptpl("check", str(project))',),
        "needs a template update to report",
    ),
    Covered(
        r"looptpl update( --dry-run| \S+)?",
        UPDATE_TESTS,
        (
            "def test_looptpl_new_then_update_keeps_every_user_edit_and_still_trains",
            '"update", str(project), "--dry-run"',
        ),
        "needs two template versions; the test updates a project from v1 to v2",
    ),
    Covered(
        r"looptpl rename \S+",
        UPDATE_TESTS,
        ("def test_rename_keeps_every_edit_and_later_updates_follow_the_new_name", 'looptpl("rename", "vision"'),
        "needs two template versions; the test renames a filled-in project, then updates it",
    ),
    Covered(
        r"copier update",
        UPDATE_TESTS,
        ("def test_plain_copier_copy_and_copier_update_keep_every_user_edit", '"copier", "update"'),
        "needs two template versions",
    ),
    Covered(
        r"copier update --conflict rej",
        UPDATE_TESTS,
        ('looptpl("update", str(project), "--conflict", "rej")',),
        "looptpl update --conflict rej runs the same copier update with conflict=rej",
    ),
    Covered(
        r"python -m venv \S+|\S+/bin/pip install looptpl==\S+|\S+/bin/looptpl check \S+",
        UPDATE_TESTS,
        ("def test_installed_wheel_upgrade_then_update", '"-m", "venv"', 'installed("check", "proj")'),
        "needs a package index; the test installs an older looptpl wheel into a fresh venv and runs its check",
    ),
)


# --- reading the docs ----------------------------------------------------------------------------


def bash_blocks(text: str) -> Iterator[str]:
    """The bodies of ```bash blocks, including those indented under a list item."""
    fence = re.compile(r"^(?P<indent>[ \t]*)```bash[ \t]*\n(?P<body>.*?)^(?P=indent)```", re.MULTILINE | re.DOTALL)
    for block in fence.finditer(text):
        yield textwrap.dedent(block["body"])


def commands_in(block: str) -> Iterator[str]:
    """Each command of a bash block, comments dropped, split at && || ; |, as one space-joined string."""
    for line in re.sub(r"\\\n", " ", block).splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in SEPARATORS:
                if words:
                    yield " ".join(words)
                words = []
            else:
                words.append(token)


def doc_commands(docs: Path = DOCS) -> dict[str, list[str]]:
    """Every command in the docs' bash blocks, with the pages that show it."""
    found: dict[str, list[str]] = {}
    for page in sorted(docs.glob("*.md")):
        for block in bash_blocks(page.read_text(encoding="utf-8")):
            for command in commands_in(block):
                found.setdefault(command, []).append(page.name)
    return found


def classify(command: str) -> Run | Covered | str | None:
    """The rule a command matches: a Run, a Covered, "cd", or None."""
    for rule in (*RUN, *COVERED):
        if re.fullmatch(rule.pattern, command):
            return rule
    return "cd" if re.fullmatch(r"cd \S+", command) else None


def coverage_problem(command: str, rule: Covered, projects: dict[str, Path]) -> str | None:
    for place in (rule, *rule.also):
        project = projects[place.project]
        path = project.parent / place.path if place.path.startswith("myproj/") else REPO_ROOT / place.path
        where = f"{place.path} ({place.project} project)" if place.path.startswith("myproj/") else place.path
        if not path.is_file():
            return f"{command!r}: {where} does not exist"
        text = path.read_text(encoding="utf-8")
        wanted = list(place.witnesses)
        if place.flags_in_file:
            wanted += [f'"{word}"' for word in command.split() if word.startswith("--")]
        missing = [witness for witness in wanted if witness not in text]
        if missing:
            return f"{command!r}: {where} lacks {missing}"
    return None


# --- running the commands ------------------------------------------------------------------------


def environment(project: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(project / "src"),
        "OMP_NUM_THREADS": "1",
    }


def run_pip_install(command: str, project: Path, scratch: Path) -> subprocess.CompletedProcess:
    """`pip install -e ...` into a throwaway venv that sees this environment's packages (offline)."""
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_packages = next(venv.glob("lib/python*/site-packages"))
    (site_packages / "parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), *command.split()[1:]]
    result = run([*pip, "--no-index", "--no-build-isolation", "-q"], cwd=project, timeout=TIMEOUT_S)
    if result.returncode == 0:
        # Installed, not found through PYTHONPATH: import it from elsewhere with a clean environment.
        where = subprocess.run(
            [str(python), "-c", "import myproj; print(myproj.__file__)"],
            cwd=scratch,
            capture_output=True,
            text=True,
            env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
        )
        result.stdout += f"\nmyproj imports from: {where.stdout.strip() or where.stderr.strip()}"
        if not where.stdout.startswith(str(project / "src")):
            result.returncode = 1
    return result


def run_command(command: str, rule: Run, projects: dict[str, Path]) -> tuple[str, Run, subprocess.CompletedProcess]:
    project = projects[rule.project]
    scratch = Path(tempfile.mkdtemp(prefix="doc-command-", dir=projects["torch"].parent.parent))
    if command.startswith("pip "):
        return command, rule, run_pip_install(command, project, scratch)
    cwd = {"scratch": scratch, "project": project, "repo": REPO_ROOT}[rule.cwd]
    return command, rule, run(command.split(), cwd=cwd, timeout=TIMEOUT_S, env=environment(project))


# Run besides the doc commands, to learn the flags of each program: (project, command).
HELP_COMMANDS = (
    ("torch", "torchrun --help"),
    *((strategy, TRAIN_HELP) for strategy in TF_STRATEGIES),
    ("multi-worker", "python -m myproj.kit.launch --help"),
    ("jax", TRAIN_HELP),
    ("jax", "python -m myproj.kit.launch --help"),
)


@pytest.fixture(scope="module")
def exercised(tmp_path_factory) -> dict:
    """Classify every doc command, generate the projects, run every RUN command and the --help of each program."""
    commands = doc_commands()
    assert QUICK_START in commands, f"the quick start must show `{QUICK_START}`"
    assert TRAIN_HELP in commands, f"the flags page must show `{TRAIN_HELP}`"
    rules = {command: classify(command) for command in commands}
    root = tmp_path_factory.mktemp("docs")
    projects: dict[str, Path] = {}
    created = {}
    for name, creation in PROJECTS.items():
        sandbox = root / ("sandbox" if name == "torch" else f"sandbox-{name}")
        sandbox.mkdir()
        projects[name] = sandbox / "myproj"
        created[name] = run(creation.split(), cwd=sandbox, timeout=TIMEOUT_S, env=environment(projects[name]))
        assert created[name].returncode == 0, created[name].stdout
    to_run = [(command, rule) for command, rule in rules.items() if isinstance(rule, Run) and command != QUICK_START]
    helps = [(command, Run(re.escape(command), "project", "--help", project=name)) for name, command in HELP_COMMANDS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda item: run_command(*item, projects), to_run + helps))
    outputs = {command: result for command, _, result in results[: len(to_run)]}
    outputs[QUICK_START] = created["torch"]
    help_outputs = {(rule.project, command): result for command, rule, result in results[len(to_run) :]}
    help_outputs["torch", TRAIN_HELP] = outputs[TRAIN_HELP]
    return {
        "commands": commands,
        "rules": rules,
        "projects": projects,
        "outputs": outputs,
        "helps": help_outputs,
    }


# --- the tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The user guide as `mkdocs build --strict` writes it: the build's output and the site folder."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[test]' to build the docs")
    site_dir = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO_ROOT / "mkdocs.yml")]
    result = run([*command, "--site-dir", str(site_dir)], cwd=REPO_ROOT, timeout=120,
                 env={"NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    return result, site_dir


def test_site_builds_strictly(built_site):
    result, site_dir = built_site
    assert result.returncode == 0, result.stdout
    assert (site_dir / "index.html").is_file()
    assert not (site_dir / "hooks").exists(), "the build's hooks are not pages"


# What a reader sees on each page, measured by the browser: a word of code in a table broken across
# lines (a break where neither side is a space), a code block that is cut instead of scrolling or
# that runs past the screen's edge, a copy button over code text, a page that scrolls sideways.
LAYOUT_PROBLEMS = """() => {
  const problems = [];
  const width = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > width + 1) problems.push("the page scrolls sideways");
  for (const code of document.querySelectorAll(".md-typeset table code")) {
    if (code.getClientRects().length < 2) continue;
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    let lineTop = null, before = " ";
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const box = range.getClientRects()[0];
        const char = node.data[i];
        if (box && lineTop !== null && box.top > lineTop + 2 && char !== " " && before !== " ")
          problems.push(`table code broken mid-word: ${code.textContent}`);
        if (box) lineTop = box.top;
        before = char;
      }
    }
  }
  for (const pre of document.querySelectorAll(".md-typeset pre")) {
    const code = pre.querySelector("code");
    const style = getComputedStyle(code);
    const start = code.textContent.slice(0, 40);
    if (code.scrollWidth > code.clientWidth + 1 && !["auto", "scroll"].includes(style.overflowX))
      problems.push(`code block cut at its edge: ${start}`);
    if (pre.getBoundingClientRect().right > width + 1) problems.push(`code block past the screen: ${start}`);
    const button = pre.querySelector(".md-code__nav, .md-clipboard");
    if (!button) continue;
    const icon = button.getBoundingClientRect();
    const box = code.getBoundingClientRect();
    const range = document.createRange();
    range.selectNodeContents(code);
    for (const line of range.getClientRects()) {
      const right = Math.min(line.right, box.right - parseFloat(style.paddingRight));
      const across = right > icon.left && line.left < icon.right;
      if (line.width > 0 && across && line.bottom > icon.top && line.top < icon.bottom) {
        problems.push(`copy button over the code: ${start}`);
        break;
      }
    }
  }
  return problems;
}"""
# Chromium without the services it would call home to (this machine's network is closed).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def test_every_page_reads_on_a_phone_and_a_desktop(built_site):
    """Each page in Chromium, 375 and 1280 pixels wide: no problem of LAYOUT_PROBLEMS on any."""
    browser_path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser_path is None:
        pytest.skip("no Chromium on this machine: apt-get install chromium (.ci/run installs it)")
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' installs playwright")
    result, site_dir = built_site
    assert result.returncode == 0, result.stdout
    pages = sorted(site_dir.glob("**/index.html"))
    assert len(pages) == len(list(DOCS.glob("*.md")))
    problems = []
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=browser_path, args=CHROMIUM_FLAGS)
        for width in (375, 1280):
            page = browser.new_page(viewport={"width": width, "height": 800})
            for html in pages:
                page.goto(html.as_uri())
                if page.locator("pre").count():  # the copy buttons are added by the theme's script
                    page.wait_for_selector(".md-code__nav, .md-clipboard", state="attached", timeout=10_000)
                name = html.parent.relative_to(site_dir).as_posix()
                problems += [f"{name} at {width} px: {problem}" for problem in page.evaluate(LAYOUT_PROBLEMS)]
            page.close()
        browser.close()
    assert not problems, "\n".join(problems[:20])


def test_commands_are_in_bash_blocks():
    for page in sorted(DOCS.glob("*.md")):
        fence = OTHER_SHELL_FENCES.search(page.read_text(encoding="utf-8"))
        assert fence is None, f"{page.name}: use ```bash for commands, so this test checks them ({fence[0]})"


def test_every_command_is_run_or_covered(exercised):
    problems = []
    for command, rule in exercised["rules"].items():
        pages = ", ".join(exercised["commands"][command])
        if rule is None:
            problems.append(f"{command!r} ({pages}) is neither run nor covered: add a RUN or COVERED rule")
        elif isinstance(rule, Covered):
            problem = coverage_problem(command, rule, exercised["projects"])
            if problem:
                problems.append(f"{problem} ({pages})")
    assert not problems, "\n".join(problems)


def test_commands_run_as_documented(exercised):
    failures = []
    for command, rule in exercised["rules"].items():
        if isinstance(rule, Run):
            result = exercised["outputs"][command]
            if result.returncode != rule.exit_code or rule.expect not in result.stdout:
                failures.append(
                    f"`{command}` exited with {result.returncode} (expected {rule.exit_code}), output must contain "
                    f"{rule.expect!r}:\n{result.stdout[-3000:]}"
                )
    assert not failures, "\n\n".join(failures)


def option_names(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text)) - {"--help"}


def test_flags_in_commands_exist(exercised):
    helps = exercised["helps"]

    def flags_of(project: str, command: str) -> set[str]:
        return option_names(helps[project, command].stdout) | {"--help"}

    problems = []
    for command in exercised["commands"]:
        rule = exercised["rules"][command]
        project = rule.project if isinstance(rule, (Run, Covered)) else "torch"
        words = command.split()
        trainer_flags = flags_of(project, TRAIN_HELP)
        for program, start, known in (
            ("-m", "myproj.train", trainer_flags),
            ("sbatch", "scripts/slurm.sbatch", trainer_flags),
        ):
            if program in words and start in words:
                unknown = {word for word in words[words.index(start) + 1 :] if word.startswith("--")} - known
                problems += [f"{command!r}: the trainer has no {flag}" for flag in sorted(unknown)]
        if words[0] == "torchrun" and "-m" in words:
            known = flags_of("torch", "torchrun --help")
            unknown = {word for word in words[1 : words.index("-m")] if word.startswith("--")} - known
            problems += [f"{command!r}: torchrun has no {flag}" for flag in sorted(unknown)]
        if "myproj.kit.launch" in words and "--" in words:
            # launch.py's own flags come before --, the trainer's after it.
            own, train = words[words.index("myproj.kit.launch") + 1 : words.index("--")], words[words.index("--") + 1 :]
            launcher = "jax" if project == "jax" else "multi-worker"  # TensorFlow's launch.py, or JAX's
            known = flags_of(launcher, "python -m myproj.kit.launch --help")
            problems += [f"{command!r}: launch.py has no {flag}" for flag in sorted({*own} - known) if flag[:2] == "--"]
            unknown = {word for word in train if word.startswith("--")} - flags_of(launcher, TRAIN_HELP)
            problems += [f"{command!r}: the trainer has no {flag}" for flag in sorted(unknown)]
    assert not problems, "\n".join(problems)


def flag_rows(heading: str) -> list[list[str]]:
    """The cells of each `--flag` row of the table under `heading` in flags.md."""
    page = (DOCS / "flags.md").read_text(encoding="utf-8")
    section = page.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    return [[cell.strip() for cell in row.split("|")[1:-1]] for row in re.findall(r"^\| `--.*$", section, re.MULTILINE)]


def test_flags_page_lists_every_trainer_flag(exercised):
    documented = set().union(*(option_names(cells[0]) for cells in flag_rows("## The training entry point")))
    assert documented == option_names(exercised["outputs"][TRAIN_HELP].stdout)


@pytest.mark.parametrize("strategy", TF_STRATEGIES)
def test_both_backends_list_the_flags_they_share_in_the_same_order(exercised, strategy):
    def in_order(help_text: str) -> list[str]:  # each option's first line in --help starts with it
        return re.findall(r"^  (--[a-z][a-z0-9-]*)", help_text, re.MULTILINE)

    torch_flags = in_order(exercised["outputs"][TRAIN_HELP].stdout)
    tensorflow_flags = in_order(exercised["helps"][strategy, TRAIN_HELP].stdout)
    shared = set(torch_flags) & set(tensorflow_flags)
    assert len(shared) > 25
    assert [flag for flag in torch_flags if flag in shared] == [flag for flag in tensorflow_flags if flag in shared]


@pytest.mark.parametrize("strategy", TF_STRATEGIES)
def test_flags_page_lists_every_tensorflow_trainer_flag(exercised, strategy):
    # A row applies to "all" strategies or names the ones it applies to, e.g. `mirrored`.
    documented: set[str] = set()
    for flags, _, applies_to, _ in flag_rows("## The TensorFlow training entry point"):
        if applies_to == "all" or f"`{strategy}`" in applies_to:
            documented |= option_names(flags)
    assert documented == option_names(exercised["helps"][strategy, TRAIN_HELP].stdout)


def test_the_check_rejects_an_unlisted_command_and_a_stale_mapping(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    page = "```bash\nmake docs  # comment\ncd myproj && looptpl todo\n```\n"
    page += "- a list item:\n\n  ```bash\n  make \\\n    all\n  ```\n"
    (docs / "page.md").write_text(page)
    commands = doc_commands(docs)
    assert list(commands) == ["make docs", "cd myproj", "looptpl todo", "make all"]
    assert classify("make docs") is None
    assert classify("cd myproj") == "cd" and isinstance(classify("looptpl todo"), Run)
    multi_gpu = "torchrun --standalone --nproc-per-node 8 -m myproj.train --dist-timeout-s 1800"
    rule = classify(multi_gpu)
    assert isinstance(rule, Covered)
    project = tmp_path / "myproj"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_distributed.py").write_text("def test_something_else(): ...\n")
    assert "lacks" in coverage_problem(multi_gpu, rule, {"torch": project})


def _figures(text: str) -> list[str]:
    """The ratios a text quotes: `0.86x`, or with a multiplication sign."""
    return re.findall(r"(?<![\d.])(\d+\.\d+)\s?[x\u00d7]", text)


def test_every_benchmark_ratio_the_docs_quote_is_in_a_result_file():
    """A figure on the benchmarks page comes from a file under bench/results/ (a ratio or the end of a
    range the benchmarks printed, as measured or rounded): a figure typed by hand, or left behind when
    the loop changed and its results were measured again, fails here."""
    measured = []
    for path in (REPO_ROOT / "bench" / "results").glob("*.txt"):
        text = path.read_text()
        measured += _figures(text) + [end for pair in re.findall(r"(\d+\.\d+) \.\. (\d+\.\d+)", text) for end in pair]
    assert measured, "bench/results/ holds no ratio"
    unbacked = []
    for quoted in sorted(set(_figures((DOCS / "benchmarks.md").read_text()))):
        places = len(quoted.split(".")[1])
        precise_enough = [figure for figure in measured if len(figure.split(".")[1]) >= places]
        if not any(round(float(figure), places) == float(quoted) for figure in precise_enough):
            unbacked.append(quoted)
    assert unbacked == [], f"docs/benchmarks.md quotes ratios no file in bench/results/ holds: {unbacked}"


@pytest.mark.parametrize("backend", ["torch", *TF_STRATEGIES])
def test_train_help_names_the_real_command_and_gives_the_defaults(exercised, backend):
    if backend == "torch":
        help_text = exercised["outputs"][TRAIN_HELP].stdout
    else:
        help_text = exercised["helps"][backend, TRAIN_HELP].stdout
    assert re.search(r"^usage: python -m myproj\.train \[flags\]$", help_text, re.MULTILINE)  # after TF's own log lines
    assert re.search(r"--epochs EPOCHS +Passes over the training data\. \(default: \d+\)", help_text)
    assert "(default: )" not in help_text  # an empty default says nothing
