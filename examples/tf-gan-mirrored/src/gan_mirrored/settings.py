"""Your own settings: flags for your model and data, and this project's defaults for the template's flags.

This file is yours: `copier update` keeps your edits here.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Settings:
    """Each field becomes a command-line flag (`hidden_size` is `--hidden-size`) listed by `--help`,
    is saved with the run's config, and is read as `config.hidden_size` in your files."""

    latent_size: int = field(default=32, metadata={"help": "Noise dimensions the generator starts from."})
    width: int = field(default=256, metadata={"help": "Hidden width of both networks (model.py)."})


# Defaults for the template's own flags in this project: GANs train with Adam(0.5, 0.999), no decay,
# a constant rate; the best checkpoint has the best quality (metrics.py).
DEFAULTS: dict[str, Any] = {
    "epochs": 40,
    "lr": 1e-3,
    "weight_decay": 0.0,
    "schedule": "constant",
    "warmup_steps": 0,
    "max_grad_norm": 0.0,
    "monitor": "val_quality",
    "monitor_mode": "max",
}

# What the project's own tests (pytest, tests/) train with, over DEFAULTS: on a large corpus, keep each
# test run to seconds on a CPU, e.g. {"steps_per_epoch": 8, "eval_batches": 2}. A test's own flags still win.
TEST_DEFAULTS: dict[str, Any] = {}
