"""Old import paths of the modules that moved into kit/. Managed by the looptpl template.

Projects made before kit/ existed import template names straight from the package (`from .collect
import Mean`, `from .config import TrainConfig`). `copier update` leaves your files as they are, so
those lines must keep working: `from .collect import ...` finds the names in `kit.collect`. New
code imports from `kit.api` and `kit.config`.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

# Every module here but these was once a module of the package itself.
MOVED = {path.stem for path in Path(__file__).parent.glob("*.py")} - {"__init__", "api", "moved"}


class OldImportPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `PKG.collect` and the like as a module holding the names of `PKG.kit.collect`."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != self.package or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def exec_module(self, module: ModuleType) -> None:
        moved = importlib.import_module(f"{self.package}.kit.{module.__name__.rpartition('.')[2]}")
        module.__dict__.update({name: value for name, value in vars(moved).items() if not name.startswith("__")})


def keep_old_import_paths(package: str) -> None:
    if not any(isinstance(finder, OldImportPaths) and finder.package == package for finder in sys.meta_path):
        sys.meta_path.append(OldImportPaths(package))
