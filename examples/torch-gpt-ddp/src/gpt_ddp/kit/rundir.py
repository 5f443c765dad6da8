"""The run directory, and data.py's one-off preparation, before a run starts. Managed by the looptpl template."""

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

from .. import distributed
from ..distributed import Runtime
from . import runs
from .checkpoint import checkpoints_in
from .config import TrainConfig
from .errors import ConfigError, DataError, user_code_error


def prepare_run_dir(config: TrainConfig, runtime: Runtime) -> tuple[TrainConfig, bool]:
    """Choose and create the run directory and save the config there; return the config naming that
    directory, and whether to resume from it."""
    # After a failure, torchrun --max-restarts starts every rank again: continue from the last checkpoint.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if runs.START in config.run_dir:
        folder = runs.choose_folder(
            config.run_dir,
            resume=config.resume,
            restarted=restarted,
            holds_run=_holds_run,
            chooses=runtime.is_main,
            share=distributed.rank0_number,
            chooser="rank 0",
        )
        config = dataclasses.replace(config, run_dir=str(folder))
    run_dir = Path(config.run_dir)
    has_run = _holds_run(run_dir)
    resume = config.resume or (restarted and has_run)
    if has_run and not resume:
        raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")
    if resume and not has_run:
        raise ConfigError(f"--resume: {run_dir} holds no checkpoint; drop --resume to start a new run")
    problem = ""
    if runtime.is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
        except OSError as error:
            problem = f"cannot write to --run-dir {run_dir} ({error.strerror}); choose a folder you can write to"
    # Only rank 0 writes, but every rank must learn whether that worked, or they would wait for it forever.
    if distributed.agree(bool(problem)):
        raise ConfigError(problem or f"rank 0 cannot write to --run-dir {run_dir}; choose a folder it can write to")
    return config, resume


def _holds_run(run_dir: Path) -> bool:
    return bool(checkpoints_in(run_dir / "checkpoints"))


def prepare_data(prepare: Callable[[TrainConfig], object] | None, config: TrainConfig, runtime: Runtime) -> None:
    """data.py's optional `prepare_data(config)` (download, tokenize, cache), run by the first rank of
    each machine while its other ranks wait; if it fails anywhere, every rank stops."""
    if prepare is None:
        return
    failure = None
    if runtime.local_rank == 0:
        try:
            prepare(config)
        except Exception as error:
            failure = error
    if distributed.wait_for_every_rank(failure is not None):
        if failure is None:
            raise DataError("data.py: prepare_data failed on another rank; its log says why")
        raise user_code_error(failure, "in prepare_data")
