"""What the loop calls in your files, checked before any of them is imported. Managed by the looptpl template.

train.py and the project's tests start with this check, `looptpl update` runs it on the merged project
and `looptpl check` on the project as it is. Each function or class the loop calls that your files lack,
each function that takes other arguments than the loop passes, and each name one of your files imports
from another that lacks it, is named, all at once, one line each, with the section of looptpl's
docs/todos.md that shows what it must be. (Without it, an update that changed what the loop calls
would show as an ImportError from inside the loop, one missing name per run.)

It reads your files as text, without running them, so it also works where the project's dependencies
are not installed. A name your file gets from elsewhere (an import, an assignment) counts as there;
its arguments are not checked. `python -m gpt_mirrored.kit.contract` runs it alone.

`template_version()` names the template version the project has; every checkpoint records it, so one
that this loop cannot continue is refused naming the version that wrote it.
"""

import ast
import re
import sys
from pathlib import Path
from typing import NamedTuple


class Need(NamedTuple):
    """A name the loop takes from one of your files: a function called with `arguments`, or a class."""

    file: str
    name: str
    arguments: tuple[str, ...] | None  # None: a class (or any name, for a constant)
    required: bool = True  # False: the loop uses it when your file defines it

    def form(self) -> str:
        return f"{self.name}({', '.join(self.arguments)})" if self.arguments is not None else self.name


NEEDS = (
    Need("data.py", "build_datasets", ("config",)),
    Need("data.py", "make_batches", ("dataset", "batch_size")),
    Need("model.py", "build_model", ("config",)),
    Need("step.py", "train_step", ("model", "batch", "config")),
    Need("step.py", "eval_step", ("model", "batch", "config")),
    Need("metrics.py", "dataset_metrics", ("means", "gathered")),
    Need("optim.py", "build_schedule", ("config", "total_steps")),
    Need("optim.py", "build_optimizer", ("config", "schedule")),
    Need("settings.py", "Settings", None),
    Need("settings.py", "DEFAULTS", None),
    Need("hooks.py", "Hooks", None),
)


# Your files. The loop imports them; each may import names from the others (step.py from loss.py, say).
YOUR_FILES = ("data.py", "model.py", "step.py", "loss.py", "metrics.py", "optim.py", "settings.py", "hooks.py")


class Module(NamedTuple):
    """What one of your files defines outside its functions and classes, read from its text."""

    names: dict[str, ast.AST | None]  # functions and classes with their definition; other names with None
    imports: list[tuple[int, str, str]]  # (line, file, name) of each `from .file import name` of your files

    @property
    def everything(self) -> bool:
        """A `*` import (its name is "*"): any name may be there."""
        return "*" in self.names


def problems(package: Path) -> list[str]:
    """One line for each name the loop calls, or one of your files imports from another, that your files
    in `package` lack, and for each function the loop calls that takes other arguments."""
    missing = [
        f"{name}: missing; the loop imports it, so make it again ({_docs(name)})"
        for name in dict.fromkeys(need.file for need in NEEDS)
        if not (package / name).is_file()
    ]
    # A file that is missing (said above) or does not parse (train.py's import of it says where) is left out.
    modules = {name: module for name in YOUR_FILES if (module := _read(package / name)) is not None}
    return missing + _unmet_needs(modules) + _broken_imports(modules)


def _unmet_needs(modules: dict[str, Module]) -> list[str]:
    found = []
    for need in NEEDS:
        module = modules.get(need.file)
        if module is None or module.everything:
            continue
        definition = module.names.get(need.name)
        if need.name not in module.names and need.required:
            found.append(f"{need.file}: defines no {need.form()}, which the loop calls; add it ({_docs(need.file)})")
        elif need.arguments is not None and _refuses(definition, len(need.arguments)):
            found.append(
                f"{need.file}:{getattr(definition, 'lineno', 1)}: {need.name} must take {len(need.arguments)} "
                f"arguments, {need.form()}, as the loop passes them ({_docs(need.file)})"
            )
    return found


def _broken_imports(modules: dict[str, Module]) -> list[str]:
    """Names one of your files imports from another that lacks them (step.py's `from .metrics import ...`)."""
    found = []
    for name, module in modules.items():
        for line, source, imported in module.imports:
            other = modules.get(source)
            if other is not None and not other.everything and imported not in other.names:
                found.append(
                    f"{name}:{line}: imports {imported} from {source}, which defines no {imported}; add it there "
                    f"or change this import ({_docs(source)})"
                )
    return found


def _docs(file: str) -> str:
    """Where looptpl's docs show what `file` holds: its section of docs/todos.md."""
    section = "losspy-and-metricspy" if file in ("loss.py", "metrics.py") else file.replace(".", "")
    return f"see docs/todos.md#{section}"


def _read(path: Path) -> Module | None:
    """What the file at `path` defines and imports from your other files; None for a file that is
    missing or does not parse (train.py's import of it then says where)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    module = Module({}, [])
    statements = list(tree.body)
    while statements:
        node = statements.pop(0)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            module.names[node.name] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            module.names.update({(alias.asname or alias.name).split(".")[0]: None for alias in node.names})
            if isinstance(node, ast.ImportFrom) and node.level == 1 and f"{node.module}.py" in YOUR_FILES:
                source = f"{node.module}.py"
                module.imports.extend((node.lineno, source, alias.name) for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):  # `A, B = 1, 2` too
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            module.names.update({name.id: None for target in targets for name in _names_in(target)})
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):  # `try: import ...`, say
            bound = [getattr(node, "target", None), *(item.optional_vars for item in getattr(node, "items", []))]
            module.names.update({name.id: None for target in bound if target for name in _names_in(target)})
            handlers = [statement for handler in getattr(node, "handlers", []) for statement in handler.body]
            statements += [*node.body, *getattr(node, "orelse", []), *handlers, *getattr(node, "finalbody", [])]
    return module


def _names_in(target: ast.AST) -> list[ast.Name]:
    """The names an assignment's target binds: `x`, and each of `a, (b, *c)`."""
    return [node for node in ast.walk(target) if isinstance(node, ast.Name)]


def _refuses(definition: ast.AST | None, count: int) -> bool:
    """Whether `definition` is a function that cannot be called with `count` positional arguments (a
    class or a name from elsewhere is not checked)."""
    if not isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    arguments = definition.args
    positional = [*arguments.posonlyargs, *arguments.args]
    required = len(positional) - len(arguments.defaults)
    too_many = count > len(positional) and arguments.vararg is None
    keyword_only = any(default is None for default in arguments.kw_defaults)  # a keyword the loop never passes
    return count < required or too_many or keyword_only


def template_version() -> str | None:
    """The template version this project was made or last updated with (`_commit` in .copier-answers.yml,
    beside src/), which each checkpoint records; None where that file is not there (an installed copy)."""
    try:
        answers = (Path(__file__).parents[3] / ".copier-answers.yml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    found = re.search(r"^_commit: *['\"]?([^'\"\s]+)", answers, re.MULTILINE)
    return found[1] if found else None


def message(package: Path) -> str:
    """The check's lines as a run prints them, `error: ...` each; empty when your files fit the loop."""
    return "\n".join(f"error: {line}" for line in problems(package))


def main() -> int:
    if found := message(Path(__file__).parents[1]):
        print(found, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
