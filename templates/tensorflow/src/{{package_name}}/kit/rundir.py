"""The run directory, before a run starts. Managed by the looptpl template."""

import dataclasses
import json
from pathlib import Path

import tensorflow as tf

from ..distributed import Runtime
from . import runs
from .config import TrainConfig
from .errors import ConfigError


def prepare_run_dir(config: TrainConfig, runtime: Runtime) -> TrainConfig:
    """Choose and create the run directory and save the config there (refusing to mix two runs in one
    place); return the config naming that directory."""
    if runs.START in config.run_dir:
        config = dataclasses.replace(config, run_dir=str(_choose_folder(config, runtime)))
    run_dir = Path(config.run_dir)
    # The chief's view, shared with every process (distributed.py), so all take the same branch.
    has_run = runtime.agree(holds_run(run_dir))
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
    return config


def _choose_folder(config: TrainConfig, runtime: Runtime) -> Path:
    """The folder `{start}` names: with --resume the newest that holds a run, else a new one. The chief
    chooses, from what it sees on disk; every worker gets its choice."""
    code, problem = 0, ""
    if runtime.is_main:
        if config.resume:
            code = runs.newest(config.run_dir, holds_run)
        else:
            try:
                code = runs.claim_new(config.run_dir)
            except OSError as error:
                where, reason = config.run_dir, error.strerror or error
                problem = f"cannot create a folder for --run-dir {where} ({reason}); choose one you can write to"
    code = runtime.chief_number(-1 if problem else code)
    if code == -1:
        raise ConfigError(problem or f"the chief cannot create a folder for --run-dir {config.run_dir}; see its line")
    if code == 0:
        raise ConfigError(
            f"--resume: no folder matching --run-dir {config.run_dir} holds a checkpoint; drop --resume to start a run"
        )
    return runs.folder_of(config.run_dir, code)


def holds_run(run_dir: Path) -> bool:
    """Whether a run directory holds a checkpoint to resume from (at an epoch's end or part-way)."""
    return any(tf.train.latest_checkpoint(str(run_dir / "checkpoints" / where)) for where in ("", "steps"))
