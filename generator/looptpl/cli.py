"""The `looptpl` command line. It parses and reports; the work happens in render.py and friends.

Start-up matters (`looptpl --help`, shell completion): this module imports only Typer and looptpl's
small modules; copier, YAML, rich and the git helpers are imported inside the commands that use them.
"""

import functools
import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from looptpl import __version__, signals
from looptpl.conflict import Conflict
from looptpl.errors import LooptplError
from looptpl.variants import BACKENDS, VARIANTS, find_variant

if TYPE_CHECKING:
    from looptpl.update import Outcome

app = typer.Typer(
    help="Generate a readable PyTorch, TensorFlow or JAX training loop that you own, then keep it up to date.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no boxes, and no `<bool>` after every flag
)

F = TypeVar("F", bound=Callable[..., Any])
# The exit status of an update that left (or a dry run that foresees) conflicts, and of `check` while markers
# remain: distinct from 1 (an error, or a newer template) so that scripts can tell them apart.
NEEDS_ATTENTION = 3


def reports_errors(command: F) -> F:
    """Turn a LooptplError into one line on stderr and its exit code: the one error path."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except LooptplError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(error.exit_code) from None
        except (signals.Cancelled, KeyboardInterrupt):  # Ctrl-C or SIGTERM: the command cleaned up on its way out
            typer.echo(f"error: {signals.MESSAGE}", err=True)
            raise typer.Exit(signals.exit_code) from None
        except Exception:
            if signals.cancelled:  # the cancellation, wrapped by the code it interrupted
                typer.echo(f"error: {signals.MESSAGE}", err=True)
                raise typer.Exit(signals.exit_code) from None
            raise

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
    """Generate a readable PyTorch, TensorFlow or JAX training loop that you own, then keep it up to date."""


def complete_backend(incomplete: str) -> list[str]:
    """Shell completion for --backend."""
    return [backend for backend in BACKENDS if backend.startswith(incomplete)]


def complete_strategy(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Shell completion for --strategy: the strategies of the --backend already typed (all without one)."""
    backend = ctx.params.get("backend")
    offered: dict[str, str] = {}  # a name two backends share is described as its first backend's
    for variant in VARIANTS:
        if variant.strategy.startswith(incomplete) and backend in (None, variant.backend):
            # The first clause fits beside the value (zsh, fish).
            offered.setdefault(variant.strategy, variant.when.split(";")[0])
    return list(offered.items())


def complete_example(incomplete: str) -> list[tuple[str, str]]:
    """Shell completion for --example: the examples this looptpl ships, with what each trains."""
    from looptpl.examples import list_examples

    return [(example.name, example.summary) for example in list_examples() if example.name.startswith(incomplete)]


@app.command(short_help="Create a training project; in a terminal, asks for the rest.")
@reports_errors
def new(
    destination: Annotated[
        str | None,
        typer.Argument(
            help="Folder to create the project in; it must not exist or be empty. Asked for in a terminal.",
            show_default=False,
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="Deep learning framework: torch or tensorflow. Asked for in a terminal when omitted; without a "
            "terminal, required unless --defaults.",
            autocompletion=complete_backend,
        ),
    ] = None,
    strategy: Annotated[
        str | None,
        typer.Option(
            help="How training is distributed (see `looptpl list`); it implies the backend. Asked for in a terminal "
            "when omitted; without a terminal, required unless --defaults.",
            autocompletion=complete_strategy,
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            help="Project name; the package name is derived from it. Asked for in a terminal; otherwise the folder "
            "name."
        ),
    ] = None,
    defaults: Annotated[
        bool,
        typer.Option(
            "--defaults", help="Ask nothing: take the default for every missing answer (torch, single, folder name)."
        ),
    ] = False,
    data: Annotated[
        list[str] | None,
        typer.Option(help="Answer a template question directly, as KEY=VALUE (repeatable), e.g. description=...)."),
    ] = None,
    git: Annotated[
        bool, typer.Option("--git/--no-git", help="Create a git repository with an initial commit (needed by updates).")
    ] = True,
    ci: Annotated[
        bool,
        typer.Option(
            "--ci/--no-ci",
            help="Add .github/workflows/ci.yml (ruff, mypy and the project's tests on every push) and a pre-commit "
            "config.",
        ),
    ] = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the files that would be created; write nothing.")
    ] = False,
    example: Annotated[
        str | None,
        typer.Option(
            help="Start from a finished example (`looptpl list` shows them): its backend and strategy, and its data, "
            "model, loss, metrics, optimizer, step and settings files in place of the TODOs, renamed to your package.",
            autocompletion=complete_example,
        ),
    ] = None,
) -> None:
    """Create a new training project from the template; in a terminal, asks for what the flags leave out."""
    from looptpl.examples import find_example
    from looptpl.gitcmd import enclosing_repository
    from looptpl.questions import add_example, merge_flags, parse_data, settle_answers
    from looptpl.render import RenderRequest, render_project
    from looptpl.validation import nearest_existing_parent, resolve_destination

    if destination is None and sys.stdin.isatty() and not defaults:
        from looptpl.questions import ask_destination

        destination = ask_destination()
    if destination is None:
        raise LooptplError("looptpl new needs DEST, the folder to create the project in: looptpl new myproj")
    # Resolved once, before any question (nobody wants to answer and then hear "not empty"); all writes go below it.
    folder = resolve_destination(destination)
    given = merge_flags(parse_data(data or []), {"backend": backend, "strategy": strategy, "project_name": name})
    chosen = find_example(example) if example is not None else None
    if chosen is not None:
        given = add_example(given, chosen)
    answers = settle_answers(
        folder,
        given,
        name_flag="--name" if name is not None else "--data project_name",
        terminal=sys.stdin.isatty(),
        defaults=defaults,
    )
    # Inside another repository (a monorepo, say) the project joins it instead of nesting a second one.
    enclosing = enclosing_repository(nearest_existing_parent(folder)) if git and not dry_run else None
    request = RenderRequest(
        destination=folder,
        answers={**answers, "ci": "true" if ci else "false"},
        git=git and enclosing is None,
        dry_run=dry_run,
        example=chosen,
    )
    files = render_project(request)
    if dry_run:
        typer.echo(f"Would create {destination} with {len(files)} files:")
        typer.echo("\n".join(f"  {path}" for path in files))
        return
    report_created(destination, answers, chosen.name if chosen else None)
    if enclosing is not None:
        typer.echo(
            f"{destination} lies inside the git repository {enclosing}, so it got no repository of its own: "
            f"commit it there (git add {destination} && git commit) before `looptpl update`."
        )


def report_created(destination: str, answers: dict[str, str], example: str | None = None) -> None:
    """Tell the user what they got and what to run next."""
    package, strategy = answers["package_name"], answers["strategy"]
    launch = find_variant(answers["backend"], strategy).first_run.replace("PKG", package)
    typer.echo(f"Created {destination} ({answers['backend']}, {strategy}).")
    typer.echo("Next:")
    typer.echo(f"  cd {destination}")
    typer.echo('  pip install -e ".[test]"')
    typer.echo(f"  {launch}")
    typer.echo("  pytest")
    if example is None:
        typer.echo(f"Then fill the TODOs in src/{package}/ (`looptpl todo` lists them).")
    else:
        typer.echo(f"Its files in src/{package}/ are example {example}'s: edit them to make it yours.")


@app.command("list", short_help="Show every backend, strategy and example, and how each launches.")
@reports_errors
def list_variants() -> None:
    """Show every backend and strategy, when to use it, and how its project is launched; then the examples."""
    from rich.console import Console
    from rich.table import Table

    from looptpl.examples import list_examples

    console = Console()
    table = Table("backend", "strategy", "when to use it", "launch", box=None, pad_edge=False, collapse_padding=True)
    # Each column as wide as its longest word (MultiWorkerMirroredStrategy:): cells wrap between words, not inside.
    for column, texts in ((2, [variant.when for variant in VARIANTS]), (3, [variant.launch for variant in VARIANTS])):
        table.columns[column].min_width = max(len(word) for text in texts for word in text.split())
    for variant in VARIANTS:
        table.add_row(variant.backend, variant.strategy, variant.when, variant.launch)
    console.print(table)
    examples = list_examples()
    if examples:
        console.print("\nExamples (looptpl new DEST --example NAME):")
        width = max(len(example.name) for example in examples)
        kinds = max(len(f"{example.backend}/{example.strategy}") for example in examples)
        for example in examples:
            # Plain lines, not a table: each stays one line that scripts and tests can read.
            kind = f"{example.backend}/{example.strategy}"
            line = f"  {example.name:<{width}}  {kind:<{kinds}}  {example.summary}"
            console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command(short_help="List the TODOs left to fill in; exit 1 while any remain (for CI).")
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
        files = list(dict.fromkeys(item.path.name for item in todos))
        typer.echo(f"{len(todos)} TODOs left; fill them in this order: {', '.join(files)}.", err=True)
        raise typer.Exit(1)
    typer.echo("No TODOs left.")


@app.command(short_help="Merge the new template into a project, keeping your edits.")
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
    strategy: Annotated[
        str | None,
        typer.Option(
            help="Switch the project to this strategy of its backend (single -> ddp, say) while updating; the engine "
            "files follow, your files stay yours, and what they newly need is shown as a diff.",
            autocompletion=complete_strategy,
        ),
    ] = None,
    merge_your_files: Annotated[
        bool,
        typer.Option(
            "--merge-your-files",
            help="Merge the template's changes to your files (data.py, model.py, ...) into them, with conflict "
            "markers where your edits clash, instead of writing each merge beside the file as FILE.merged.",
        ),
    ] = False,
) -> None:
    """Merge the installed looptpl's template into a project, keeping your edits; exit 3 if files need attention."""
    from looptpl.update import Status, update_project

    # Shows its phases on stderr in a terminal.
    outcome = update_project(path, conflict, dry_run, strategy, into_yours=merge_your_files)
    if outcome.plan.status is Status.CURRENT and not outcome.changed:
        typer.echo(f"{path} is already up to date (template {outcome.plan.current}); nothing to do.")
        return
    report_update(path, outcome, conflict, dry_run, strategy, merge_your_files)
    # A dry run that foresees a conflict fails too, so a script or CI job notices; files the user deleted
    # stay deleted on every update, so they fail the update itself only.
    stranded = sorted({edit.path for edit in outcome.stranded})
    attention = [*outcome.conflicts, *stranded] if dry_run else [*outcome.conflicts, *stranded, *outcome.deleted]
    attention += [line.partition(":")[0] for line in outcome.unmet]  # "metrics.py: defines no ..."
    if merge_your_files:  # your files themselves hold the markers
        attention += [name for name, conflicts in outcome.merged if conflicts]
    attention = list(dict.fromkeys(attention))  # a file with markers and a stranded edit, named once
    if attention:
        need = "would need" if dry_run else "need"
        typer.echo(f"{len(attention)} file(s) {need} attention: {', '.join(attention)}", err=True)
        raise typer.Exit(NEEDS_ATTENTION)


def report_update(
    path: Path,
    outcome: "Outcome",
    conflict: Conflict,
    dry_run: bool,
    strategy: str | None = None,
    into_yours: bool = False,
) -> None:
    """List the changed files, the ones that clash with the user's edits, and what to do next."""
    action = "Would update" if dry_run else "Updated"
    current, new = outcome.plan.current, outcome.plan.template.label
    versions = f"from template {current} to {new}" if current != outcome.plan.template.ref else f"(template {current})"
    switch = f", switching to the {outcome.strategy} strategy" if outcome.strategy else ""
    typer.echo(f"{action} {path} {versions}{switch}:")
    typer.echo("\n".join(f"  {line}" for line in outcome.changed) or "  (no file changes)")
    inline = conflict is Conflict.inline
    where = "has conflict markers (<<<<<<< / >>>>>>>)" if inline else "has a .rej file beside it"
    section(f"Your edits clash with the template here; each file {where}:", outcome.conflicts)
    section(
        "Your edits here changed template code that the new version moved to another file or removed, so "
        "they may no longer run; check each one and carry it over where the code went:",
        [edit.describe() for edit in outcome.stranded],
    )
    section(
        "You deleted these generated files, so the update left them deleted and the template's fixes to them "
        f"were not applied; if that was a mistake, restore them (git checkout {outcome.generated_in[:12]} -- "
        "FILE), commit and update again:",
        outcome.deleted,
    )
    notes = [line for note in outcome.notes for line in note.splitlines()]
    section(f"What changed in the template since {current} (templates/CHANGELOG.md):", notes)
    section(
        "This template version asks questions your project's answers lacked; the update answered them with "
        "their defaults (recorded in .copier-answers.yml):",
        outcome.defaulted,
    )
    lack, train = ("would lack", "would not train") if dry_run else ("lack", "will not train")
    section(
        f"Your files {lack} what the new loop calls, so the project {train} until you add it"
        + (":" if into_yours else " (your files are yours: an update never changes them):"),
        outcome.unmet,
    )
    if dry_run:
        typer.echo(f"Nothing was changed. Run `{update_command(path, conflict, strategy, into_yours)}` to apply.")
    elif outcome.conflicts:
        fix = "keep what you need and delete the markers" if inline else "apply each .rej by hand, then delete it"
        typer.echo(f"Resolve them ({fix}), review with `git diff`, then commit.")
    else:
        typer.echo("Review with `git diff`, then commit (or undo it with `git reset --hard && git clean -fd`).")
    if outcome.owned_changes and not into_yours:
        typer.echo(
            "The template changed its own version of files you own, which an update leaves as you wrote them; "
            "apply what you want of these changes by hand:"
        )
        typer.echo("\n".join(diff.rstrip("\n") for diff in outcome.owned_changes))
    section(
        "The template's changes to your files, merged into them (review them with `git diff`; where your edits "
        "and a change touch the same lines the file holds conflict markers):"
        if into_yours
        else "Those changes merged into your copies, beside them (review each, then move it over your file; "
        "where your edits and the change touch the same lines it holds conflict markers):",
        [f"{name} ({f'{count} conflict' + 's' * (count > 1) if count else 'clean'})" for name, count in outcome.merged],
    )


def section(heading: str, items: list[str]) -> None:
    """A heading, then its items indented (an empty line stays empty); nothing without items."""
    if items:
        typer.echo(heading)
        typer.echo("\n".join(f"  {item}" if item else "" for item in items))


def update_command(path: Path, conflict: Conflict, strategy: str | None, into_yours: bool = False) -> str:
    """The `looptpl update` that applies what a dry run with these options showed, quoted for a shell."""
    import shlex

    options = ["--strategy", strategy] if strategy is not None else []
    if conflict is not Conflict.inline:
        options += ["--conflict", conflict.value]
    if into_yours:
        options.append("--merge-your-files")
    return shlex.join(["looptpl", "update", str(path), *options])


@app.command(short_help="Rename the project's package; later updates follow it.")
@reports_errors
def rename(
    new_name: Annotated[str, typer.Argument(help="The package's new name, a Python identifier (my_model).")],
    path: Annotated[
        Path, typer.Argument(help="The generated project's folder; a git repository with no uncommitted changes.")
    ] = Path("."),
) -> None:
    """Rename the project's package (src/OLD to src/NEW, its imports, the answers file); updates follow it.

    Your edits are kept. Exit 3 if files need attention."""
    from looptpl.rename import rename_package

    renamed = rename_package(path, new_name)
    typer.echo(f"Renamed the package {renamed.old} to {renamed.new} in {path}:")
    typer.echo("\n".join(f"  {line}" for line in renamed.changed))
    if renamed.mentions:
        typer.echo(f"These lines still say {renamed.old}; change the ones that mean the package:")
        typer.echo("\n".join(f"  {line}" for line in renamed.mentions))
    if renamed.conflicts:
        typer.echo("Your edits and the rename change the same lines here; each file has conflict markers:")
        typer.echo("\n".join(f"  {name}" for name in renamed.conflicts))
        typer.echo("Keep what you need and delete the markers, run the tests, then commit.")
        typer.echo(f"{len(renamed.conflicts)} file(s) need attention: {', '.join(renamed.conflicts)}", err=True)
        raise typer.Exit(NEEDS_ATTENTION)
    typer.echo("Review with `git diff`, run the tests, then commit (or undo it with `git reset --hard`).")


@app.command(short_help="Tell whether the template is newer than a project; exit 1 if so.")
@reports_errors
def check(
    path: Annotated[Path, typer.Argument(help="The generated project's folder.")] = Path("."),
) -> None:
    """Tell whether this looptpl has a newer template than a project; exit 1 if so (for CI), 3 on conflicts.

    Exit 3 while files still hold the conflict markers of an update, or while your files lack what the
    project's loop calls."""
    from looptpl import contract
    from looptpl.answers import read_answers
    from looptpl.update import Status, files_with_markers, plan_update

    unfinished = files_with_markers(path)  # first: whatever else is wrong, an unfinished merge is named
    if unfinished:
        typer.echo(
            f"{path} has an unfinished update: conflict markers or a .rej file for {', '.join(unfinished)}; keep what "
            "you need of each side and delete the marker lines (or apply the .rej by hand and delete it), then commit",
            err=True,
        )
        raise typer.Exit(NEEDS_ATTENTION)
    answers = read_answers(path)
    if unmet := contract.unmet(path, answers.get("package_name")):
        typer.echo("\n".join(f"error: {line}" for line in unmet), err=True)
        raise typer.Exit(NEEDS_ATTENTION)
    plan = plan_update(path, answers)
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
    # A command lives for a second or so and keeps little garbage, but the cyclic garbage collector
    # would run dozens of times while copier's dependencies import and once more over every object at
    # exit: about 0.15 s of `looptpl new` (docs/benchmarks.md). So it stays off, and what exists at exit
    # is frozen out of the final collection.
    gc.disable()
    try:
        app(prog_name="looptpl")
    finally:
        gc.freeze()
