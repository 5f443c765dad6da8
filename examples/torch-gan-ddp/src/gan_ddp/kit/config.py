"""Run configuration: one typed dataclass, its command line, and its checks.

Managed by the looptpl template: put your own settings in settings.py.
"""

import argparse
import dataclasses
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from typing import Literal

from ..settings import DEFAULTS, Settings
from . import runs
from .config_file import read_config_file
from .errors import ConfigError, first_rank, report
from .trackers import missing_package


@dataclass
class TrainConfig(Settings):
    """Every setting of a run: yours from settings.py, then the template's. Each field is a
    command-line flag: `global_batch_size` is `--global-batch-size`, and a boolean `progress` is
    switched off with `--no-progress`."""

    config: str = field(
        default="",
        metadata={"help": "A TOML file of flags, without their dashes (epochs = 20); the command line wins over it."},
    )
    epochs: int = field(default=10, metadata={"help": "Passes over the training data."})
    max_steps: int = field(
        default=0,
        metadata={
            "help": "Train for this many optimizer updates instead of --epochs; the last epoch may end "
            "part-way. 0: train for --epochs."
        },
    )
    steps_per_epoch: int = field(
        default=0,
        metadata={
            "help": "End each epoch after this many updates, drawn from that epoch's own shuffle of the train set "
            "(for a train set too large to pass over between validations). 0: the whole train set."
        },
    )
    global_batch_size: int = field(
        default=64,
        metadata={"help": "Samples per optimizer update, summed over all ranks and accumulation steps."},
    )
    grad_accum_steps: int = field(
        default=1, metadata={"help": "Micro-batches accumulated per optimizer update on each rank."}
    )
    lr: float = field(default=3e-3, metadata={"help": "Peak learning rate, reached after warmup."})
    weight_decay: float = field(default=0.01, metadata={"help": "Decoupled weight decay."})
    schedule: Literal["cosine", "constant"] = field(
        default="cosine", metadata={"help": "Learning-rate shape after warmup."}
    )
    warmup_steps: int = field(default=20, metadata={"help": "Optimizer updates of linear warmup."})
    min_lr: float = field(
        default=0.0, metadata={"help": "The learning rate the cosine schedule ends at (--lr / 10, say)."}
    )
    max_grad_norm: float = field(
        default=1.0, metadata={"help": "Clip the global gradient norm to this value; 0 turns clipping off."}
    )
    ema_decay: float = field(
        default=0.0,
        metadata={
            "help": "Keep an exponential moving average of the weights with this decay (0.999, say), evaluated and "
            "checkpointed beside them as val_ema_* and test_ema_*. 0: none."
        },
    )
    nan_policy: Literal["stop", "skip"] = field(
        default="stop",
        metadata={"help": "On NaN/inf gradients: stop the run, or skip that update (one host sync per update)."},
    )
    max_consecutive_skips: int = field(
        default=10,
        metadata={"help": "With --nan-policy skip: stop after more than this many skipped updates in a row."},
    )
    precision: Literal["fp32", "bf16", "fp16"] = field(
        default="fp32", metadata={"help": "Autocast precision; fp16 adds dynamic loss scaling."}
    )
    tf32: bool = field(
        default=True,
        metadata={
            "help": "On GPUs, let float32 matrix products and convolutions use TF32 tensor cores (about 3x faster, "
            "10-bit mantissa); --no-tf32 computes them in full float32."
        },
    )
    compile: bool = field(default=False, metadata={"help": "Compile the model with torch.compile."})
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = field(
        default="default",
        metadata={
            "help": "torch.compile's mode with --compile: reduce-overhead replays CUDA graphs (fewer kernel launches, "
            "for small models; every batch shape is recorded once), max-autotune also searches faster kernels."
        },
    )
    activation_checkpointing: bool = field(
        default=False,
        metadata={"help": "Recompute model.py's checkpoint_units in the backward pass: only their inputs are kept."},
    )
    profile: bool = field(
        default=False,
        metadata={
            "help": "Record updates 4 to 6 with torch's profiler into <run-dir>/profile (for TensorBoard or Perfetto) "
            "and print the most expensive operations."
        },
    )
    train_in_eval_mode: bool = field(
        default=False,
        metadata={
            "help": "Train with the model in eval mode (no dropout, batch norm on running statistics): the tests "
            "that compare runs over different numbers of ranks use it to make them exactly comparable."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed for weights, shuffling and augmentation."})
    run_dir: str = field(
        default="runs/{start}",
        metadata={
            "help": "Folder for the config, metrics, checkpoints and summary; {start} becomes the time the run "
            "started (runs/2026-11-26_09-30-00), a folder for each run. Without {start}, one fixed folder."
        },
    )
    resume: bool = field(
        default=False,
        metadata={"help": "Continue from the latest checkpoint in --run-dir (with {start}: in the newest run)."},
    )
    stop_after_epoch: int = field(
        default=0,
        metadata={"help": "Stop after this epoch, e.g. to fit a job time limit; --resume later continues. 0: run all."},
    )
    stop_after_step: int = field(
        default=0,
        metadata={"help": "Stop after this update, with a checkpoint; --resume later continues exactly. 0: run all."},
    )
    checkpoint_every: int = field(
        default=0,
        metadata={
            "help": "Also checkpoint every this many updates inside an epoch, for long epochs; --resume "
            "continues exactly from there. 0: at epoch ends only."
        },
    )
    eval_every: int = field(
        default=0,
        metadata={
            "help": "Also validate every this many updates inside an epoch, logged to steps.jsonl; the best "
            "checkpoint and early stopping still go by epoch ends. 0: at epoch ends only."
        },
    )
    eval_batch_size: int = field(default=256, metadata={"help": "Evaluation batch size per rank."})
    eval_batches: int = field(
        default=0,
        metadata={
            "help": "Evaluate this many batches of --eval-batch-size from each split instead of all of it: the same "
            "samples every time, drawn once from the split, for any number of ranks. 0: the whole split."
        },
    )
    num_workers: int = field(
        default=-1,
        metadata={
            "help": "DataLoader worker processes per rank; -1: none on the CPU, and on GPUs up to 4, as many as the "
            "machine's CPUs shared among its ranks allow."
        },
    )
    device: Literal["auto", "cpu", "cuda"] = field(
        default="auto", metadata={"help": "Where to train; auto picks CUDA when available."}
    )
    monitor: str = field(
        default="val_loss", metadata={"help": "Metric that picks the best checkpoint and early stopping."}
    )
    monitor_mode: Literal["min", "max"] = field(
        default="min", metadata={"help": "Whether a lower or a higher --monitor value is better."}
    )
    early_stop_patience: int = field(
        default=0, metadata={"help": "Stop after this many epochs without improvement; 0 never stops early."}
    )
    test_on: Literal["best", "last"] = field(default="best", metadata={"help": "Which checkpoint the final test uses."})
    keep_checkpoints: int = field(
        default=2, metadata={"help": "Checkpoints kept besides the best (epoch ends and --checkpoint-every alike)."}
    )
    async_checkpoints: bool = field(
        default=False, metadata={"help": "Write checkpoints in a background thread while training goes on."}
    )
    log_every: int = field(
        default=10, metadata={"help": "Optimizer updates between progress updates, loss checks and steps.jsonl lines."}
    )
    tracker: Literal["none", "wandb", "mlflow"] = field(
        default="none",
        metadata={
            "help": "Also log to Weights & Biases or MLflow (pip install -e .[wandb] or .[mlflow] first), from the "
            "process that logs; trackers.py says how to run them offline."
        },
    )
    progress: bool = field(default=True, metadata={"help": "Show a progress bar when attached to a terminal."})
    dist_timeout_s: int = field(
        default=600, metadata={"help": "Seconds a collective may wait for the other ranks before failing."}
    )

    def validate(self, named: dict[str, str] | None = None) -> None:
        """Reject values that cannot work, naming the flag, or the place in `named` (base.toml: epochs)."""
        where = {name: f"--{flag(name)}" for name in self.__dataclass_fields__} | (named or {})
        positive = ["epochs", "global_batch_size", "grad_accum_steps", "eval_batch_size", "log_every"]
        positive += ["max_consecutive_skips", "keep_checkpoints", "dist_timeout_s"]
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{where[name]} must be at least 1, got {getattr(self, name)}")
        non_negative = ["lr", "weight_decay", "warmup_steps", "min_lr", "max_grad_norm", "early_stop_patience"]
        non_negative += ["stop_after_epoch", "stop_after_step", "checkpoint_every", "eval_every", "eval_batches"]
        non_negative += ["max_steps", "steps_per_epoch"]
        for name in non_negative:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{where[name]} must be a finite number, got {value}")
            if value < 0:
                raise ConfigError(f"{where[name]} must not be negative, got {value}")
        check_min_lr(self, where)
        if not 0 <= self.seed < 2**32:  # torch's CPU generator keeps 32 bits of a seed: 2**32 would train like 0
            raise ConfigError(f"{where['seed']} must be between 0 and 2**32 - 1 (4294967295), got {self.seed}")
        if not self.run_dir.strip():
            raise ConfigError(f"{where['run_dir']} is empty: the run would go into the current folder; name a folder")
        if problem := runs.pattern_problem(self.run_dir):
            raise ConfigError(f"{where['run_dir']} {problem}, got {self.run_dir!r}")
        cpus = os.cpu_count() or 1
        if self.num_workers < -1:
            raise ConfigError(f"{where['num_workers']} must be -1 (automatic) or at least 0, got {self.num_workers}")
        if self.num_workers > 8 * cpus:
            workers = f"{where['num_workers']} {self.num_workers}"
            raise ConfigError(f"{workers} is far more than this machine's {cpus} CPUs; use at most {cpus}")
        if self.dist_timeout_s > 7 * 24 * 3600:
            raise ConfigError(f"{where['dist_timeout_s']} must be at most a week (604800), got {self.dist_timeout_s}")
        if problem := missing_package(self.tracker):
            raise ConfigError(problem)
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"{where['ema_decay']} must be at least 0 and below 1 (0.999, say), got {self.ema_decay}")
        if self.nan_policy == "skip" and self.precision == "fp16":
            raise ConfigError(
                f"{where['nan_policy']} skip does not combine with {where['precision']} fp16, whose loss scaler "
                "already skips updates with inf/NaN gradients; choose stop with fp16, or bf16"
            )

    def check_batch_split(self, world_size: int) -> None:
        """Refuse a global batch that does not split into equal micro-batches, one per rank and micro-step."""
        replicas_times_accum = world_size * self.grad_accum_steps
        if self.global_batch_size % replicas_times_accum:
            raise ConfigError(
                f"--global-batch-size {self.global_batch_size} must be divisible by ranks x "
                f"--grad-accum-steps = {world_size} x {self.grad_accum_steps}; "
                f"use a multiple of {replicas_times_accum}"
            )


# Settings baked into the optimizer, the schedule or the data order: a resumed run must keep them.
OPTIMIZER_SETTINGS = ("lr", "weight_decay", "schedule", "warmup_steps", "min_lr", "ema_decay")
FIXED_FOR_A_RUN = (*OPTIMIZER_SETTINGS, "global_batch_size", "steps_per_epoch", "seed")


def check_min_lr(config: TrainConfig, where: dict[str, str]) -> None:
    """Refuse a --min-lr the schedule cannot end at (`where` names each setting as the user gave it)."""
    if config.min_lr > config.lr:
        raise ConfigError(
            f"{where['min_lr']} {config.min_lr} is above {where['lr']} {config.lr}: the schedule decays from "
            f"{where['lr']} down to {where['min_lr']}"
        )
    if config.min_lr and config.schedule != "cosine":
        schedule = f"{where['schedule']} {config.schedule}"
        raise ConfigError(f"{where['min_lr']} is where the cosine schedule ends; {schedule} has none")


def check_resumable(config: TrainConfig, saved: dict[str, object]) -> None:
    """Refuse to resume with settings that would make the rest of the run differ from the start."""
    changed = [
        f"--{flag(name)} {getattr(config, name)} (the run used {saved[name]})"
        for name in FIXED_FOR_A_RUN
        if name in saved and saved[name] != getattr(config, name)
    ]
    if changed:
        raise ConfigError(
            f"cannot resume with a changed {', '.join(changed)}; pass the run's values, or start a new --run-dir"
        )


def flag(name: str) -> str:
    """The command-line spelling of a field name."""
    return name.replace("_", "-")


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Build the config from the command line (every field is a flag) and validate it.

    settings.py's DEFAULTS replace the template's defaults, a --config file replaces those, and a flag
    given on the command line wins. A mistake is one line naming its flag, or its file and key.
    """
    parser = FlagParser(
        prog=f"python -m {__name__.rsplit('.', 2)[0]}.train",  # this project's package: PKG.kit.config's PKG
        usage="%(prog)s [flags]",
        description="Train the model. Every flag is also a key of a --config file; yours (settings.py) come first.",
        formatter_class=ShowDefaults,
        allow_abbrev=False,
    )
    types = typing.get_type_hints(TrainConfig)
    # The --config file first: its values become the defaults that the other flags override.
    config_file = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    config_file.add_argument("--config", default="")
    path = config_file.parse_known_args(argv)[0].config
    try:  # mistakes in files: one line, without the usage block that argparse adds for the flags
        from_file, places = read_config_file(path, types) if path else ({}, {})
        if clashes := [name for name in Settings.__dataclass_fields__ if name in TrainConfig.__annotations__]:
            raise ConfigError(f"settings.py: {', '.join(clashes)} is a flag of the template already; rename it")
        if unknown := [name for name in DEFAULTS if name not in TrainConfig.__dataclass_fields__]:
            raise ConfigError(f"settings.py: DEFAULTS names {', '.join(unknown)}, which is no flag (see --help)")
    except ConfigError as error:
        parser.exit(2, f"error: {error}\n")
    template_fields = set(TrainConfig.__dataclass_fields__) - set(Settings.__dataclass_fields__)
    for item in dataclasses.fields(TrainConfig):
        kind, help_text = types[item.name], item.metadata.get("help", "")
        default = from_file.get(item.name, DEFAULTS.get(item.name, item.default))
        if item.name in DEFAULTS and item.name in template_fields:
            help_text += " (settings.py sets the default)"
        if kind is bool:
            parser.add_argument(
                f"--{flag(item.name)}", action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
        elif typing.get_origin(kind) is Literal:
            parser.add_argument(f"--{flag(item.name)}", choices=typing.get_args(kind), default=default, help=help_text)
        else:
            parser.add_argument(f"--{flag(item.name)}", type=_number(kind), default=default, help=help_text)
    config = TrainConfig(**vars(parser.parse_args(argv)))
    try:  # a value the file set (and no flag replaced) is named as the file's key: base.toml: epochs
        config.validate({name: place for name, place in places.items() if getattr(config, name) == from_file[name]})
    except ConfigError as error:
        parser.exit(2, f"error: {error}\n")
    return config


class FlagParser(argparse.ArgumentParser):
    """argparse, with a mistake reported once under torchrun (by rank 0, and to torchrun's error file)."""

    def error(self, message: str) -> typing.NoReturn:
        if first_rank():
            self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}\n")

    def exit(self, status: int = 0, message: str | None = None) -> typing.NoReturn:
        if message and status:
            report(message)
        elif message:
            print(message, end="")
        sys.exit(status)


class ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help gives each flag's default (as settings.py or a --config file set it), except an empty one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in ("", None):
            return action.help
        return super()._get_help_string(action)


def _number(kind: type) -> typing.Callable[[str], object]:
    """int, float or str parsing, where floats refuse nan and inf (`--lr nan` would silently train nothing)."""
    if kind is not float:
        return kind

    def finite_float(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(text)
        return value

    finite_float.__name__ = "finite float"
    return finite_float
