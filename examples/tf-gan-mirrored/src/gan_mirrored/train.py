"""Train gan_mirrored: parse the config, build, fit, test. Managed by the looptpl template.

Launch:
    python -m gan_mirrored.train                                  # every GPU of this machine, else the CPU
    CUDA_VISIBLE_DEVICES=0,1 python -m gan_mirrored.train         # two of its GPUs
    python -m gan_mirrored.train --cpu-replicas 2                 # 2 replicas on the CPU, no GPU needed
    # N machines: generate the multi-worker variant (looptpl new --strategy multi-worker)

Your code lives in model.py, data.py, loss.py, metrics.py and optim.py; `--help` lists every flag.
"""

import dataclasses
import json
import sys
from pathlib import Path

import keras
import tensorflow as tf

from .errors import ConfigError, RunError, first_line, import_failure, in_your_code, three_datasets

try:  # your files are imported here (settings.py by config.py): a mistake in one is one line, not a traceback
    from . import distributed
    from .config import TrainConfig, parse_config
    from .data import build_datasets
    from .engine import Trainer
    from .evaluation import finite_or_raise
except Exception as error:
    if (problem := import_failure(error)) is None:
        raise
    sys.exit(f"error: {problem}")


def prepare_run_dir(config: TrainConfig, runtime: distributed.Runtime) -> None:
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


def run(config: TrainConfig, runtime: distributed.Runtime) -> int:
    """Train, test and write the summary; returns the exit status."""
    prepare_run_dir(config, runtime)
    # The same seed in every run: the same data order and the same initial weights.
    keras.utils.set_random_seed(config.seed)
    with in_your_code("building the datasets"):
        datasets = build_datasets(config)
    trainer = Trainer(config, runtime, three_datasets(datasets))
    if config.resume:
        trainer.resume()
    summary = trainer.fit()
    if summary is None:
        if runtime.is_main:
            print(f"stopped {trainer.stopped}, checkpointed; continue with --resume", flush=True)
        # 143 (128 + SIGTERM) tells a scheduler the job was stopped, not finished.
        return 143 if trainer.terminate else 0
    if runtime.is_main:
        (Path(config.run_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        width = max(map(len, summary))
        print("\n".join(f"{name:<{width}}  {value}" for name, value in summary.items()), flush=True)
    # The summary is written either way; a NaN test result still fails the run.
    finite_or_raise(summary, "the final test")
    return 0


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    try:
        # The strategy comes first: it sets up the devices
        # before any other TensorFlow op runs.
        return run(config, distributed.setup(config))
    except RunError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except tf.errors.InvalidArgumentError as error:
        # A value the compiled step refused as it ran (a label out of range, a sample of another
        # shape): TensorFlow raises it from inside the graph, with no line of your code to name.
        print(
            f"error: a batch was refused ({first_line(error)}); check the samples data.py gives (labels in range, "
            "shapes) and make_batches",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
