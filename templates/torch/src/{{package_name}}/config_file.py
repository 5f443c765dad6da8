"""Config files: `--config configs/base.toml` takes flags from a TOML file. Managed by the looptpl template.

The file names flags without their dashes, one `key = value` per line, with `-` or `_`:

    # configs/base.toml
    epochs = 20
    lr = 3e-4
    global-batch-size = 256
    precision = "bf16"
    progress = false

A flag given on the command line wins over the file, the file over settings.py's DEFAULTS, and
those over the template's defaults. The run directory's config.json holds what the run used.
"""

import math
import sys
import typing
from typing import Any, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as a package, which this project depends on there
    import tomli as tomllib

from .errors import ConfigError

KIND_NAMES = {bool: "true or false", int: "a whole number", float: "a finite number", str: "a string"}


def read_config_file(path: str, kinds: dict[str, Any]) -> dict[str, Any]:
    """The file's values by field name, each checked against `kinds` (field name: its type)."""
    try:
        with open(path, "rb") as file:
            table = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except OSError as error:
        raise ConfigError(f"--config {path}: cannot read it ({error.strerror})") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {path} is not valid TOML: {error}") from None
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # field name: the key that set it
    for key, value in table.items():
        name = key.replace("-", "_")
        if name == "config":
            raise ConfigError(f"{path}: a config file cannot name another (config = {value!r}); merge the two files")
        if name not in kinds:
            raise ConfigError(f"{path}: {key!r} is no flag; its keys are the flags of --help, without the dashes")
        if name in spelled:
            raise ConfigError(f"{path}: {spelled[name]!r} and {key!r} set the same flag; keep one of them")
        values[name], spelled[name] = _checked(value, kinds[name], f"{path}: {key}"), key
    return values


def _checked(value: Any, kind: Any, where: str) -> Any:
    """`value` if it has the field's type (an int is a float too); else a ConfigError naming the key."""
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if value not in choices:
            raise ConfigError(f"{where} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(kind, type) and kind not in KIND_NAMES and not isinstance(value, kind):
        try:  # a type of yours in settings.py (a Path, say): built from the value, as the command line does
            return kind(value)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{where}: {error}") from None
    fits = isinstance(value, kind) if isinstance(kind, type) else True  # e.g. a generic alias: as given
    if kind is int and isinstance(value, bool):  # TOML's true is no count
        fits = False
    if kind is float and fits and not math.isfinite(value):  # nan and inf would silently train nothing
        fits = False
    if not fits:
        raise ConfigError(f"{where} must be {KIND_NAMES.get(kind, kind.__name__)}, got {value!r}")
    return value
