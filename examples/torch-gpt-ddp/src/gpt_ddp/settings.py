"""Your own settings: flags for your model and data, and this project's defaults for the template's flags.

This file is yours: `copier update` keeps your edits here.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Settings:
    """Each field becomes a command-line flag (`max_bytes` is `--max-bytes`) listed by `--help`."""

    width: int = field(default=96, metadata={"help": "Width of the transformer (model.py)."})
    layers: int = field(default=2, metadata={"help": "Transformer blocks (model.py)."})
    heads: int = field(default=4, metadata={"help": "Attention heads per block (model.py)."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout in every block (model.py)."})
    max_bytes: int = field(default=64, metadata={"help": "Tokens in a window: the model's context (data.py)."})
    corpus_bytes: int = field(default=0, metadata={"help": "Train on the corpus's first N bytes; 0: all (data.py)."})
    data_dir: str = field(default="data", metadata={"help": "Where prepare_data writes the token files."})


# nanoGPT-like, sized for a CPU: epochs of 200 updates, each validated on 10 batches of 64 fixed windows;
# AdamW's decay of nanoGPT (0.1, on the matrices: optim.py), cosine from 2e-3 down to 2e-4.
DEFAULTS: dict[str, Any] = {
    "epochs": 6,
    "steps_per_epoch": 200,
    "eval_batches": 10,
    "eval_batch_size": 64,
    "global_batch_size": 32,
    "lr": 2e-3,
    "weight_decay": 0.1,
    "min_lr": 2e-4,
    "warmup_steps": 100,
}

# The project's own tests (tests/) train 8 updates an epoch and validate on 2 batches: seconds a run on a CPU.
TEST_DEFAULTS: dict[str, Any] = {"steps_per_epoch": 8, "eval_batches": 2}
