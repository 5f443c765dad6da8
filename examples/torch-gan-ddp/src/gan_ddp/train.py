"""Train gan_ddp: parse the config, build, fit, test. Managed by the looptpl template.

Launch:
    python -m gan_ddp.train                                            # one process: CPU or one GPU
    torchrun --standalone --nproc-per-node 8 -m gan_ddp.train           # 8 GPUs on one machine
    torchrun --standalone --nproc-per-node 2 -m gan_ddp.train --device cpu  # 2 CPU ranks (gloo)
    # N machines: run on every node; HOST is the first node's address, JOB any shared id
    torchrun --nnodes N --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        --rdzv-id JOB --max-restarts 3 -m gan_ddp.train

Your code lives in data.py, model.py, step.py, loss.py, metrics.py, optim.py and settings.py;
`--help` lists every flag, yours first.
"""

import dataclasses
import json
import os
import random
import sys
from pathlib import Path

import torch

from .errors import ConfigError, DataError, RunError, import_failure, in_your_code, three_datasets, user_code_error

try:  # your files are imported here (settings.py by config.py): a mistake in one is one line, not a traceback
    from . import data, distributed
    from .checkpoint import checkpoints_in
    from .config import TrainConfig, parse_config
    from .data import build_datasets
    from .engine import Trainer
    from .evaluation import finite_or_raise
    from .model import build_model
except Exception as error:
    if (problem := import_failure(error)) is None:
        raise
    sys.exit(f"error: {problem}")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def prepare_run_dir(config: TrainConfig, runtime: distributed.Runtime) -> bool:
    """Create the run directory and save the config there; return whether to resume from it."""
    run_dir = Path(config.run_dir)
    has_run = bool(checkpoints_in(run_dir / "checkpoints"))
    # After a failure, torchrun --max-restarts starts every rank again: continue from the last checkpoint.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
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
    return resume


def prepare_data(config: TrainConfig, runtime: distributed.Runtime) -> None:
    """data.py's optional `prepare_data(config)` (download, tokenize, cache), run by the first rank of
    each machine while its other ranks wait; if it fails anywhere, every rank stops."""
    prepare = getattr(data, "prepare_data", None)
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


def run(config: TrainConfig, runtime: distributed.Runtime) -> int:
    """Train, test and write the summary; returns the exit status."""
    resume = prepare_run_dir(config, runtime)
    prepare_data(config, runtime)
    # The same seed on every rank: identical data and identical initial weights everywhere.
    seed_everything(config.seed)
    with in_your_code("building the model"):
        built = build_model(config)
    with in_your_code("building the datasets"):
        datasets = build_datasets(config)
    trainer = Trainer(config, runtime, built, three_datasets(datasets))
    if resume:
        trainer.resume()
    else:
        # From here on each rank draws its own numbers (dropout, augmentation).
        seed_everything(config.seed + runtime.rank)
    summary = trainer.fit()
    trainer.checkpointer.finish()  # the last checkpoint may still be being written (--async-checkpoints)
    if summary is None:
        if runtime.is_main:
            print(f"stopped {trainer.stopped}, checkpointed; continue with --resume", flush=True)
        # 143 (128 + SIGTERM) tells a scheduler the job was stopped, not finished.
        return 143 if trainer.terminate else 0
    if runtime.is_main:
        (Path(config.run_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        width = max(map(len, summary))
        print("\n".join(f"{name:<{width}}  {value}" for name, value in summary.items()), flush=True)
    # The summary is written either way; a NaN test result still fails the run (on every rank alike).
    finite_or_raise(summary, "the final test")
    return 0


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    try:
        exit_code = run(config, distributed.setup(config))
    except RunError as error:
        print(f"error: {error}", file=sys.stderr)
        # An error raised alike on every rank lets all of them leave together; one raised on this rank
        # alone (a bad batch) must not wait for the others, which would hang in their next collective.
        distributed.teardown(wait_for_others=error.on_every_rank)
        return error.exit_code
    except BaseException as error:
        # A crash: leave at once so the other ranks fail fast instead of waiting for this one.
        distributed.teardown(wait_for_others=False)
        reason = distributed.explain_failure(error)
        if reason is not None:
            print(f"error: {reason}", file=sys.stderr)
            return 1
        raise
    distributed.teardown(wait_for_others=True)
    return exit_code


if __name__ == "__main__":
    exit_code = main()
    # Leave without the interpreter's teardown: a finished rank was seen, rarely, to abort there
    # ("terminate called without an active exception") while C++ threads of torch.distributed
    # were being destroyed, turning a successful run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
