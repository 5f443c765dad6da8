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


def read_config_file(path: str, kinds: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's values by field name, each checked against `kinds` (field name: its type), and where
    each was set, for messages: `base.toml: global-batch-size`, the key as the file spells it."""
    try:
        with open(path, "rb") as file:
            content = file.read()
        table = tomllib.loads(content.decode())
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except OSError as error:
        raise ConfigError(f"--config {path}: cannot read it ({error.strerror})") from None
    except UnicodeDecodeError as error:
        line = content.count(b"\n", 0, error.start) + 1
        byte = content[error.start]
        raise ConfigError(
            f"--config {path}: line {line} is not UTF-8 text (byte {byte:#04x}); save the file as UTF-8"
        ) from None
    except ValueError as error:  # TOMLDecodeError, or a number of more digits than Python reads (4300)
        raise ConfigError(f"--config {path} is not valid TOML: {str(error).split(';')[0]}") from None
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
    return values, {name: f"{path}: {key}" for name, key in spelled.items()}


def _checked(value: Any, kind: Any, where: str) -> Any:
    """`value` if it has the field's type (an int is a float too); else a ConfigError naming the key."""
    if isinstance(value, str) and "\0" in value:  # no file or metric name holds one: an escape gone wrong
        raise ConfigError(f"{where} holds a NUL character (\\u0000); remove it")
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if value not in choices:
            raise ConfigError(f"{where} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    whole = isinstance(value, int) and not isinstance(value, bool)
    if kind is float and whole:
        if abs(value) > sys.float_info.max:
            raise ConfigError(f"{where} is too large for a float (over 1.8e308); use a smaller number")
        value = float(value)
    elif whole and not -(2**63) <= value < 2**63:  # TOML's integers are 64-bit; Python's parser reads any size
        raise ConfigError(f"{where} is past the range of TOML's 64-bit integers; use one from -2**63 to 2**63 - 1")
    if isinstance(kind, type) and kind not in KIND_NAMES and not isinstance(value, kind):
        try:  # a type of yours in settings.py (a Path, say): built from the value, as the command line does
            return kind(value)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{where}: {error}") from None
    fits = isinstance(value, kind) if isinstance(kind, type) else True  # e.g. a generic alias: as given
    if kind is int and isinstance(value, bool):  # TOML's true is no count
        fits = False
    if kind is float and fits and not math.isfinite(value):  # nan and inf would silently train nothing
        past = " (a number past 1.8e308 reads as inf)" if math.isinf(value) else ""
        raise ConfigError(f"{where} must be a finite number, got {value!r}{past}")
    if not fits:
        raise ConfigError(f"{where} must be {KIND_NAMES.get(kind, kind.__name__)}, got {value!r}")
    return value
