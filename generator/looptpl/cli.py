"""The `looptpl` command line. It parses and reports; the work happens in render.py and friends."""

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from looptpl import __version__
from looptpl.errors import LooptplError

app = typer.Typer(
    help="Generate a readable PyTorch or TensorFlow training loop that you own, then keep it up to date.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])
QUESTIONS = ("project_name", "package_name", "description", "backend", "strategy")


def reports_errors(command: F) -> F:
    """Turn a LooptplError into one line on stderr and its exit code: the one error path."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except LooptplError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(error.exit_code) from None

    return wrapper  # type: ignore[return-value]


def show_version(value: bool) -> None:
    if value:
        typer.echo(f"looptpl {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=show_version, is_eager=True, help="Print the looptpl version and exit."),
    ] = False,
) -> None:
    """Generate a readable PyTorch or TensorFlow training loop that you own, then keep it up to date."""


@app.command()
@reports_errors
def new(
    destination: Annotated[
        Path, typer.Argument(help="Folder to create the project in; it must not exist or be empty.")
    ],
    backend: Annotated[
        str | None, typer.Option(help="Deep learning framework: torch or tensorflow. Asked for when omitted.")
    ] = None,
    strategy: Annotated[
        str | None,
        typer.Option(help="How training is distributed (see `looptpl list`). Asked for when omitted."),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(help="Project name; the package name is derived from it. Defaults to the folder name."),
    ] = None,
    defaults: Annotated[
        bool, typer.Option("--defaults", help="Use the default for every question instead of asking.")
    ] = False,
    data: Annotated[
        list[str] | None,
        typer.Option(help="Answer a template question directly, as KEY=VALUE (repeatable), e.g. description=...)."),
    ] = None,
    git: Annotated[
        bool, typer.Option("--git/--no-git", help="Create a git repository with an initial commit (needed by updates).")
    ] = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the files that would be created; write nothing.")
    ] = False,
) -> None:
    """Create a new training project from the template."""
    from looptpl.render import RenderRequest, render_project
    from looptpl.validation import check_package_name, check_project_name, package_name_for
    from looptpl.variants import find_variant

    answers = parse_data(data or [])
    interactive = sys.stdin.isatty() and not defaults
    if backend is not None or not interactive:
        backend = backend or "torch"
        strategy = strategy or ("single" if backend == "torch" else "one-device")
    if backend is not None and strategy is not None:
        find_variant(backend, strategy)
        answers.update(backend=backend, strategy=strategy)
    elif strategy is not None:
        answers["strategy"] = strategy
    project_name = name or answers.get("project_name") or destination.absolute().name
    if name is not None or not interactive:
        check_project_name(project_name, "--name" if name else "the folder name (pass --name)")
        answers["project_name"] = project_name
        answers.setdefault("package_name", package_name_for(project_name))
    if "package_name" in answers:
        check_package_name(answers["package_name"], "--name" if name else "--data package_name")

    files = render_project(
        RenderRequest(destination=destination, answers=answers, interactive=interactive, git=git, dry_run=dry_run)
    )
    if dry_run:
        typer.echo(f"Would create {destination} with {len(files)} files:")
        typer.echo("\n".join(f"  {path}" for path in files))
        return
    report_created(destination)


def parse_data(items: list[str]) -> dict[str, str]:
    answers: dict[str, str] = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or key not in QUESTIONS:
            raise LooptplError(f"--data {item!r} must be KEY=VALUE with KEY one of: {', '.join(QUESTIONS)}")
        answers[key] = value
    return answers


def report_created(destination: Path) -> None:
    """Tell the user what they got and what to run next."""
    import yaml

    answers = yaml.safe_load((destination / ".copier-answers.yml").read_text())
    package, strategy = answers["package_name"], answers["strategy"]
    launch = {
        "single": f"python -m {package}.train --epochs 3",
        "ddp": f"torchrun --standalone --nproc-per-node 2 -m {package}.train --device cpu --epochs 3",
        "fsdp": f"torchrun --standalone --nproc-per-node 2 -m {package}.train --device cpu --epochs 3",
    }.get(strategy, f"python -m {package}.train --epochs 3")
    typer.echo(f"Created {destination} ({answers['backend']}, {strategy}).")
    typer.echo("Next:")
    typer.echo(f"  cd {destination}")
    typer.echo('  pip install -e ".[test]"')
    typer.echo(f"  {launch}")
    typer.echo("  pytest")
    typer.echo(f"Then fill the TODOs in src/{package}/ (`looptpl todo` lists them).")


@app.command("list")
@reports_errors
def list_variants() -> None:
    """Show every backend and strategy, when to use it, and how its project is launched."""
    from rich.console import Console
    from rich.table import Table

    from looptpl.variants import VARIANTS

    table = Table("backend", "strategy", "when to use it", "launch", box=None)
    for variant in VARIANTS:
        status = "" if variant.available else " (not available yet)"
        table.add_row(variant.backend, variant.strategy + status, variant.when, variant.launch)
    Console().print(table)


@app.command()
@reports_errors
def todo(
    path: Annotated[Path, typer.Argument(help="The generated project's folder.")] = Path("."),
) -> None:
    """List the TODOs still to fill in a generated project; exit with 1 while any remain (for CI)."""
    from looptpl.todos import find_todos

    todos = find_todos(path)
    for item in todos:
        typer.echo(f"{item.path}:{item.line}: {item.text}")
    if todos:
        typer.echo(f"{len(todos)} TODOs left.", err=True)
        raise typer.Exit(1)
    typer.echo("No TODOs left.")


def main() -> None:
    """Entry point of the `looptpl` script."""
    app(prog_name="looptpl")
