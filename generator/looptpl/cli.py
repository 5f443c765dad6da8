"""The `looptpl` command line. It parses and reports; the work happens in render.py and friends."""

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from looptpl import __version__
from looptpl.errors import LooptplError
from looptpl.update import Conflict, Outcome

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
        "mirrored": f"python -m {package}.train --cpu-replicas 2 --epochs 3",
        "multi-worker": f"python -m {package}.launch --workers 2 -- --epochs 3",
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
        table.add_row(variant.backend, variant.strategy, variant.when, variant.launch)
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


@app.command()
@reports_errors
def update(
    path: Annotated[
        Path, typer.Argument(help="The generated project's folder; a git repository with no uncommitted changes.")
    ] = Path("."),
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show the files the update would change and any conflicts; change nothing."),
    ] = False,
    conflict: Annotated[
        Conflict,
        typer.Option(
            help="Where a template change that clashes with your edit goes: inline conflict markers in the file, "
            "or a .rej file beside it."
        ),
    ] = Conflict.inline,
) -> None:
    """Merge the installed looptpl's template into a project, keeping your edits; exit 1 if files need attention."""
    from rich.console import Console

    from looptpl.update import Status, update_project

    with Console(stderr=True).status(f"Updating {path}: rendering the old and the new template, merging..."):
        outcome = update_project(path, conflict, dry_run)
    if outcome.plan.status is Status.CURRENT:
        typer.echo(f"{path} is already up to date (template {outcome.plan.current}); nothing to do.")
        return
    report_update(path, outcome, conflict, dry_run)
    if outcome.conflicts and not dry_run:
        typer.echo(f"{len(outcome.conflicts)} file(s) need attention: {', '.join(outcome.conflicts)}", err=True)
        raise typer.Exit(1)


def report_update(path: Path, outcome: Outcome, conflict: Conflict, dry_run: bool) -> None:
    """List the changed files, the ones that clash with the user's edits, and what to do next."""
    action = "Would update" if dry_run else "Updated"
    typer.echo(f"{action} {path} from template {outcome.plan.current} to {outcome.plan.template.label}:")
    typer.echo("\n".join(f"  {line}" for line in outcome.changed) or "  (no file changes)")
    inline = conflict is Conflict.inline
    if outcome.conflicts:
        where = "has conflict markers (<<<<<<< / >>>>>>>)" if inline else "has a .rej file beside it"
        typer.echo(f"Your edits clash with the template here; each file {where}:")
        typer.echo("\n".join(f"  {name}" for name in outcome.conflicts))
    if dry_run:
        typer.echo(f"Nothing was changed. Run `looptpl update {path}` to apply.")
    elif outcome.conflicts:
        fix = "keep what you need and delete the markers" if inline else "apply each .rej by hand, then delete it"
        typer.echo(f"Resolve them ({fix}), review with `git diff`, then commit.")
    else:
        typer.echo("Review with `git diff`, then commit (or undo it with `git reset --hard && git clean -fd`).")


@app.command()
@reports_errors
def check(
    path: Annotated[Path, typer.Argument(help="The generated project's folder.")] = Path("."),
) -> None:
    """Tell whether this looptpl has a newer template than a project; exit 1 when the two differ (for CI)."""
    from looptpl.update import Status, plan_update

    plan = plan_update(path)
    ours = f"this looptpl's template ({plan.template.label})"
    if plan.status is Status.CURRENT:
        typer.echo(f"{path} is up to date with {ours}.")
        return
    if plan.status is Status.AVAILABLE:
        typer.echo(f"{path} uses template {plan.current}; {ours} is newer.")
        typer.echo(f"Run `looptpl update {path}` to merge it (add --dry-run to preview).")
    else:
        typer.echo(f"{path} uses template {plan.current}, newer than {ours}; upgrade looptpl to update it.")
    raise typer.Exit(1)


def main() -> None:
    """Entry point of the `looptpl` script."""
    app(prog_name="looptpl")
