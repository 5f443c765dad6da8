"""Where the Copier template and the examples live: inside the installed package, or at the root of a checkout."""

from pathlib import Path
from typing import Any

from looptpl.errors import LooptplError

PACKAGE_DIR = Path(__file__).resolve().parent


def template_root() -> Path:
    """The folder holding copier.yml and templates/."""
    for candidate in (PACKAGE_DIR / "_template", PACKAGE_DIR.parents[1]):
        if (candidate / "copier.yml").is_file() and (candidate / "templates").is_dir():
            return candidate
    raise LooptplError("the looptpl template is missing from this installation; reinstall looptpl", exit_code=1)


def copier_config(text: str | None = None) -> dict[str, Any]:
    """copier.yml, parsed: the installed template's, or `text` (another template version's). Its questions'
    defaults and the user's files (`_skip_if_exists`) are read from here only."""
    import yaml  # not needed by the commands that never read it

    if text is None:
        text = (template_root() / "copier.yml").read_text(encoding="utf-8")
    config: dict[str, Any] = yaml.safe_load(text)
    return config


def examples_root() -> Path | None:
    """The folder of finished examples beside the template (a wheel ships it as `_template/examples`), if any."""
    folder = template_root() / "examples"
    return folder if folder.is_dir() else None


def is_git_checkout(root: Path) -> bool:
    """A checkout of the looptpl repository (development), rather than an installed copy."""
    return (root / ".git").exists()
