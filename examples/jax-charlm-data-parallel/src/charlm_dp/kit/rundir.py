"""The run directory, before a run starts. Managed by the looptpl template."""

import dataclasses
import json
from pathlib import Path

from ..distributed import Runtime, agree, process0_number
from . import runs
from .checkpoint import COMMITTED
from .config import TrainConfig
from .errors import ConfigError


def prepare_run_dir(config: TrainConfig, runtime: Runtime) -> TrainConfig:
    """Choose and create the run directory and save the config there (refusing to mix two runs in one
    place); return the config naming that directory."""
    if runs.START in config.run_dir:
        folder = runs.choose_folder(
            config.run_dir,
            resume=config.resume,
            restarted=False,
            holds_run=holds_run,
            chooses=runtime.is_main,
            share=process0_number,
            chooser="process 0",
        )
        config = dataclasses.replace(config, run_dir=str(folder))
    run_dir = Path(config.run_dir)
    # Process 0's view, shared with every process, so all take the same branch.
    has_run = agree(holds_run(run_dir))
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
    # Only process 0 writes, but every process must learn whether that worked, or they would wait for it forever.
    if agree(bool(problem)):
        raise ConfigError(problem or f"process 0 cannot write to --run-dir {run_dir}; choose a folder it can write to")
    return config


def holds_run(run_dir: Path) -> bool:
    """Whether a run directory holds a finished checkpoint to resume from."""
    return any((step / COMMITTED).exists() for step in (run_dir / "checkpoints").glob("*"))
