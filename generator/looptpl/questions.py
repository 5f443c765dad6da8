"""The answers a new project is rendered with: the flags first, then questions in a terminal, else defaults.

Every answer is settled here, before copier runs, so copier never prompts. The questions are plain
lines that work in any terminal, the strategy is chosen among its backend's strategies only, and a
wrong answer is explained and asked again. Without a terminal nobody can answer: a missing backend
or strategy is then an error that names the flag, unless --defaults asks for the defaults. The
project name falls back to the folder name and the description to the template's, as the help says.
"""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from looptpl import signals
from looptpl.errors import LooptplError
from looptpl.validation import (
    check_package_name,
    check_project_name,
    description_problem,
    package_name_for,
    package_name_problem,
    project_name_problem,
)
from looptpl.variants import BACKENDS, VARIANTS, backend_of, check_backend, find_variant, strategies

if TYPE_CHECKING:
    from looptpl.examples import Example

QUESTIONS = ("project_name", "package_name", "description", "backend", "strategy")
FLAGS = {"backend": "--backend", "strategy": "--strategy", "project_name": "--name"}  # questions with their own flag


def parse_data(items: Sequence[str]) -> dict[str, str]:
    """`--data KEY=VALUE` items as answers."""
    answers: dict[str, str] = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or key not in QUESTIONS:
            raise LooptplError(f"--data {item!r} must be KEY=VALUE with KEY one of: {', '.join(QUESTIONS)}")
        answers[key] = value
    return answers


def merge_flags(data: dict[str, str], flags: dict[str, str | None]) -> dict[str, str]:
    """The answers from --data and from the flags (`{"backend": "torch", ...}`); the two must not disagree."""
    # Backends and strategies are names in lower case; `--strategy DDP` means ddp.
    data = {key: value.lower() if key in ("backend", "strategy") else value for key, value in data.items()}
    given = dict(data)
    for key, value in flags.items():
        if value is None:
            continue
        value = value.lower() if key in ("backend", "strategy") else value
        if key in data and data[key] != value:
            flag = FLAGS[key]
            raise LooptplError(
                f"{flag} {value} and --data {key}={data[key]} disagree; pass only one of them (or give both the "
                "same value)"
            )
        given[key] = value
    return given


def add_example(given: dict[str, str], example: "Example") -> dict[str, str]:
    """The answers for `--example`: its backend and strategy (a different one given is an error) and description."""
    answers = dict(given)
    for key, value in (("backend", example.backend), ("strategy", example.strategy)):
        if answers.get(key, value) != value:
            raise LooptplError(
                f"{FLAGS[key]} {answers[key]} conflicts with --example {example.name}, a {example.backend}/"
                f"{example.strategy} project; drop {FLAGS[key]} (the example sets it) or choose another example"
            )
        answers[key] = value
    if "description" not in answers and not description_problem(example.summary):
        answers["description"] = example.summary
    return answers


def settle_answers(
    destination: Path,
    given: dict[str, str],
    *,
    name_flag: str,
    terminal: bool,
    defaults: bool,
) -> dict[str, str]:
    """Check the given answers, then complete them by asking (terminal, no --defaults) or with defaults.

    `given` holds the answers from the flags and --data; `name_flag` is the flag a bad project name
    came from, for the error message.
    """
    answers = dict(given)
    backend, strategy = answers.get("backend"), answers.get("strategy")
    if backend is None and strategy is not None:
        backend = backend_of(strategy)  # the first backend that has it: --backend picks another
        if backend is None:
            known = ", ".join(dict.fromkeys(variant.strategy for variant in VARIANTS))
            raise LooptplError(f"--strategy {strategy} is not a known strategy; choose one of: {known}")
    if backend is not None:
        check_backend(backend)
    if backend is not None and strategy is not None:
        find_variant(backend, strategy)
    if "description" in answers:
        _check(description_problem(answers["description"]), "--data description")
    if "package_name" in answers:
        check_package_name(answers["package_name"], "--data package_name")
    if "project_name" in answers:
        _check_project_name(answers, name_flag)

    if terminal and not defaults:
        backend = backend or _ask_backend()
        strategy = strategy or _ask_strategy(backend)
        if "project_name" not in answers:
            answers["project_name"] = _ask_project_name(destination, "package_name" in answers)
        if "description" not in answers:
            answers["description"] = _ask("Description", template_default("description"), description_problem)
    else:
        if not defaults:
            _require(backend, strategy)
        backend = backend or BACKENDS[0]
        strategy = strategy or strategies(backend)[0]
        if "project_name" not in answers:
            answers["project_name"] = destination.absolute().name
            _check_project_name(answers, "the folder name")
    answers.update(backend=backend, strategy=strategy)
    answers.setdefault("package_name", package_name_for(answers["project_name"]))
    return answers


def _check(problem: str | None, flag: str) -> None:
    if problem:
        raise LooptplError(f"{flag}: {problem}")


def _check_project_name(answers: dict[str, str], flag: str) -> None:
    check_project_name(answers["project_name"], flag)
    if "package_name" not in answers:
        check_package_name(package_name_for(answers["project_name"]), flag)


def _require(backend: str | None, strategy: str | None) -> None:
    """Without a terminal, a missing backend or strategy is an error: guessing would hide a typo in a script."""
    if backend is None:
        missing = "--backend and --strategy are" if strategy is None else "--backend is"
        raise LooptplError(
            f"{missing} missing and there is no terminal to ask in; pass them (e.g. --backend torch --strategy "
            f"single; `looptpl list` shows every choice), or --defaults for {BACKENDS[0]}/{strategies(BACKENDS[0])[0]}"
        )
    if strategy is None:
        choices = strategies(backend)
        raise LooptplError(
            f"--strategy is missing and there is no terminal to ask in; with --backend {backend} pass one of: "
            f"{', '.join(choices)}, or --defaults for {choices[0]}"
        )


def _ask(question: str, default: str | None, problem: Callable[[str], str | None]) -> str:
    """Ask until the answer has no problem; Enter takes the default. Ctrl-C or Ctrl-D cancels."""

    def checked(value: str) -> str:
        value = value.strip()
        found = problem(value)
        if found:
            raise typer.BadParameter(found)
        return value

    try:
        return str(typer.prompt(question, default=default, value_proc=checked))
    except typer.Abort:
        typer.echo("", err=True)
        raise LooptplError(signals.MESSAGE, exit_code=130) from None  # 130: as for Ctrl-C


def _one_of(choices: Sequence[str]) -> Callable[[str], str | None]:
    return lambda value: None if value.lower() in choices else f"choose one of: {', '.join(choices)}"


def ask_destination() -> str:
    """DEST, asked for in a terminal when `looptpl new` was given none."""
    return _ask("Folder for the project", None, lambda value: None if value else "name a folder, e.g. myproj")


def _ask_backend() -> str:
    return _ask(f"Backend ({', '.join(BACKENDS)})", BACKENDS[0], _one_of(BACKENDS)).lower()


def _ask_strategy(backend: str) -> str:
    choices = [variant for variant in VARIANTS if variant.backend == backend]
    width = max(len(variant.strategy) for variant in choices)
    typer.echo(f"Strategies for {backend}:")
    for variant in choices:
        typer.echo(f"  {variant.strategy:<{width}}  {variant.when}")
    names = [variant.strategy for variant in choices]
    return _ask(f"Strategy ({', '.join(names)})", names[0], _one_of(names)).lower()


def _ask_project_name(destination: Path, package_given: bool) -> str:
    """The project name, the folder's by default; the package name derived from it must be valid too."""

    def problem(name: str) -> str | None:
        return project_name_problem(name) or (None if package_given else package_name_problem(package_name_for(name)))

    folder = destination.absolute().name
    return _ask("Project name", None if problem(folder) else folder, problem)


def template_default(question: str) -> str:
    """A question's default as copier.yml states it (read here, so the two cannot disagree)."""
    from looptpl.template_source import copier_config

    return str(copier_config()[question]["default"])
