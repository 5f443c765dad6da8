"""Learning-rate schedules with linear warmup. Managed by the looptpl template: edit optim.py instead."""

import math
from collections.abc import Callable
from typing import TypeVar

import torch

from .errors import DataError


def warmup_schedule(
    optimizer: torch.optim.Optimizer, name: str, warmup_steps: int, total_steps: int, min_lr: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to each parameter group's rate over `warmup_steps`, then `cosine` decay to
    `min_lr` (--min-lr; a group whose rate is lower stays at its rate) or `constant`."""

    def factor_for(base_lr: float) -> Callable[[int], float]:
        floor = min(1.0, min_lr / base_lr) if base_lr > 0 else 0.0  # LambdaLR scales the group's rate

        def factor(step: int) -> float:
            if step < warmup_steps:
                return (step + 1) / warmup_steps
            if name == "constant":
                return 1.0
            progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

        return factor

    factors = [factor_for(group["lr"]) for group in optimizer.param_groups]
    plain = all(type(group["lr"]) is float for group in optimizer.param_groups)  # no tensor: set directly
    scheduler = (LeanLambdaLR if plain else torch.optim.lr_scheduler.LambdaLR)(optimizer, factors)
    scheduler.min_lr = min_lr  # type: ignore[attr-defined]  # check_floor reads it
    return scheduler


class LeanLambdaLR(torch.optim.lr_scheduler.LambdaLR):
    """torch's LambdaLR for rates that are numbers, stepped in half the time (LambdaLR's checks and
    bookkeeping cost a small model's update a few microseconds): after the first steps, whose order torch
    checks, each step sets the rates `base rate x factor(step)` directly, as LambdaLR computes them."""

    def step(self, epoch: int | None = None) -> None:
        if epoch is not None or self._step_count < 2:
            super().step(epoch)
            return
        self._step_count += 1
        self.last_epoch += 1
        rates = [base * factor(self.last_epoch) for base, factor in zip(self.base_lrs, self.lr_lambdas, strict=True)]
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        self._last_lr = rates


Schedule = TypeVar("Schedule")


def check_floor(schedule: Schedule, min_lr: float) -> Schedule:
    """The schedule optim.py built, refused if it is the template's and does not end at --min-lr:
    an optim.py written before that flag existed does not pass it on, and the flag would change nothing."""
    floor = getattr(schedule, "min_lr", min_lr)  # a schedule of your own has none: yours to use --min-lr
    if floor != min_lr:
        raise DataError(
            f"optim.py: the template's schedule ends at min_lr={floor}, but --min-lr is {min_lr}: "
            "pass min_lr=config.min_lr where optim.py builds it"
        )
    return schedule
