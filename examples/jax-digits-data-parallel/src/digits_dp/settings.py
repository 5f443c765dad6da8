"""Your own settings: flags for your model and data, and this project's defaults for the template's flags.

This file is yours: `copier update` keeps your edits here.
"""

from dataclasses import dataclass
from typing import Any


@dataclass
class Settings:
    """Each field becomes a command-line flag (`hidden_size` is `--hidden-size`) listed by `--help`,
    is saved with the run's config, and is read as `config.hidden_size` in your files."""


# Defaults for the template's own flags in this project, e.g. {"epochs": 30, "monitor": "val_accuracy"}.
# A flag given on the command line still wins.
DEFAULTS: dict[str, Any] = {}

# What the project's own tests (pytest, tests/) train with, over DEFAULTS: on a large corpus, keep each
# test run to seconds on a CPU, e.g. {"steps_per_epoch": 8, "eval_batches": 2}. A test's own flags still win.
TEST_DEFAULTS: dict[str, Any] = {}
