"""Your own settings: flags for your model and data, and this project's defaults for the template's flags.

This file is yours: `copier update` keeps your edits here.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Settings:
    """Each field becomes a command-line flag (`hidden_size` is `--hidden-size`) listed by `--help`,
    is saved with the run's config, and is read as `config.hidden_size` in your files."""

    width: int = field(default=96, metadata={"help": "Width of the transformer (model.py)."})
    layers: int = field(default=2, metadata={"help": "Transformer blocks (model.py)."})
    heads: int = field(default=4, metadata={"help": "Attention heads per block (model.py)."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout after attention and the MLP (model.py)."})
    max_bytes: int = field(default=256, metadata={"help": "Longest function kept, in bytes (data.py)."})
    eval_functions: int = field(
        default=601, metadata={"help": "Functions in each of the validation and test splits (data.py)."}
    )
    train_functions: int = field(
        default=0, metadata={"help": "Functions in the train split, the first N; 0 takes all (data.py)."}
    )


# Defaults for the template's own flags in this project, e.g. {"epochs": 30, "monitor": "val_accuracy"}.
# A flag given on the command line still wins.
DEFAULTS: dict[str, Any] = {"epochs": 6, "global_batch_size": 32, "lr": 2e-3, "warmup_steps": 50}

# What the project's own tests (pytest, tests/) train with, over DEFAULTS: on a large corpus, keep each
# test run to seconds on a CPU, e.g. {"steps_per_epoch": 8, "eval_batches": 2}. A test's own flags still win.
TEST_DEFAULTS: dict[str, Any] = {"steps_per_epoch": 8, "eval_batches": 2}
