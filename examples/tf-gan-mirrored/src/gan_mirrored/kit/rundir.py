"""The run directory, before a run starts. Managed by the looptpl template."""

import dataclasses
import json
from pathlib import Path

import tensorflow as tf

from ..distributed import Runtime
from .config import TrainConfig
from .errors import ConfigError


def prepare_run_dir(config: TrainConfig, runtime: Runtime) -> None:
    """Create the run directory and save the config there; refuse to mix two runs in one place."""
    run_dir = Path(config.run_dir)
    # The chief's view, shared with every process (distributed.py), so all take the same branch.
    saved = [tf.train.latest_checkpoint(str(run_dir / "checkpoints" / where)) for where in ("", "steps")]
    has_run = runtime.agree(saved != [None, None])
    if has_run and not config.resume:
        raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")
    if config.resume and not has_run:
        raise ConfigError(f"--resume: {run_dir} holds no checkpoint; drop --resume to start a new run")
    problem = ""
    if runtime.is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
        except OSError as error:
            problem = f"cannot write to --run-dir {run_dir} ({error.strerror}); choose a folder you can write to"
    # Only the chief writes, but every worker must learn whether that worked, or they would wait for it forever.
    if runtime.agree(bool(problem)):
        raise ConfigError(problem or f"the chief cannot write to --run-dir {run_dir}; choose a folder it can write to")
