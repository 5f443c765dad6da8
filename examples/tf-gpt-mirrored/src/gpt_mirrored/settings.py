"""Your own settings: flags for your model and data, and this project's defaults for the template's flags.

This file is yours: `copier update` keeps your edits here.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Settings:
    """Each field becomes a command-line flag (`corpus_bytes` is `--corpus-bytes`) listed by `--help`,
    is saved with the run's config, and is read as `config.corpus_bytes` in your files."""

    width: int = field(default=96, metadata={"help": "Width of the transformer (model.py)."})
    layers: int = field(default=2, metadata={"help": "Transformer blocks (model.py)."})
    heads: int = field(default=4, metadata={"help": "Attention heads per block (model.py)."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout in every block (model.py)."})
    corpus_bytes: int = field(default=0, metadata={"help": "Use the corpus's first N bytes; 0: all (data.py)."})


# nanoGPT-like, sized for a CPU: epochs of 200 updates, each validated on 10 batches of 64 fixed windows.
DEFAULTS: dict[str, Any] = {
    "epochs": 6,
    "steps_per_epoch": 200,
    "eval_batches": 10,
    "eval_batch_size": 64,
    "global_batch_size": 32,
    "lr": 2e-3,
    "min_lr": 2e-4,
    "warmup_steps": 100,
}
# The project's own tests: 8 updates an epoch, validated on 2 batches, on the corpus's first 200 kB (seconds
# a run on a CPU: every epoch shuffles every window's offset), and without dropout: each replica draws its own
# masks, and the tests compare 1 replica with 2 weight by weight.
TEST_DEFAULTS: dict[str, Any] = {"steps_per_epoch": 8, "eval_batches": 2, "dropout": 0.0, "corpus_bytes": 200_000}
