"""The stages of an update, one per optimizer: which weights each trains, its schedule, scaler and NaN guard.

Managed by the looptpl template: put your own code in step.py and optim.py.

A run has one stage per optimizer (optim.py), in order. With one optimizer there is one stage
and nothing else to know. With several (a GAN's discriminator, then its generator), step.py
yields one loss per stage; while a stage runs, only its weights take gradients, so the other
networks neither compute nor synchronize gradients they would not use.
"""

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..distributed import Runtime
from .callbacks import NonFiniteGuard
from .collect import Mean, check_train_value
from .config import TrainConfig
from .errors import DataError, StepError, TrainingError, user_code_error
from .schedules import check_floor


@dataclass
class Stage:
    """An optimizer, its schedule and fp16 loss scaler, and the wrapped models whose weights it updates."""

    name: str
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    models: list[nn.Module]
    nan_guard: NonFiniteGuard
    params: list[torch.nn.Parameter] = field(init=False)
    grad_norm: torch.Tensor | None = field(default=None, init=False)  # of the last update, before clipping
    per: str = field(default="sample", init=False)  # what one unit of its loss weight is (Mean's `per`)
    # k: every rank's loss holds k unweighted values per sample, so W is k x the update's samples (0: not so, None:
    # not known before the first update; distributed.exact_factor)
    values_per_sample: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.params = [param for group in self.optimizer.param_groups for param in group["params"]]


@contextlib.contextmanager
def only_training(stage: Stage, stages: list[Stage]) -> Iterator[None]:
    """While `stage` runs, the weights of the other stages take no gradient (restored afterwards)."""
    others = [param for other in stages if other is not stage for param in other.params if param.requires_grad]
    for param in others:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param in others:
            param.requires_grad_(True)


def loss_totals(losses: list[Mean]) -> torch.Tensor:
    """[sum of w_i l_i, sum of w_i] over a stage's micro-steps on this rank, for the logs."""
    pairs = [torch.stack([loss.total.detach(), loss.weight]) for loss in losses]
    return pairs[0] if len(pairs) == 1 else torch.stack(pairs).double().sum(dim=0)


def micro_step_losses(
    train_step: Callable[[Any, Any, TrainConfig], Any], models: Any, batch: Any, config: TrainConfig, first: str
) -> Iterator[tuple[str, Mean]]:
    """step.py's losses for one micro-batch, one per stage: a returned `Mean` is the first stage's,
    a generator yields (name, Mean) pairs. Nothing runs before the first loss is asked for."""
    result = train_step(models, batch, config)
    if isinstance(result, Iterator):
        yield from result
    else:
        yield first, result


def next_loss(losses: Iterator[tuple[str, Mean]], stage: Stage, stages: list[Stage]) -> Mean:
    """The loss that `stage` trains on from a micro-batch's `micro_step_losses`, checked."""
    try:
        given = next(losses)
    except StopIteration:
        raise StepError(f"train_step yielded no loss for optimizer {stage.name!r} of optim.py") from None
    except Exception as error:
        raise user_code_error(error, "in train_step") from None
    if not (isinstance(given, tuple) and len(given) == 2) or (len(stages) > 1 and given[0] != stage.name):
        names = [stage.name for stage in stages]
        raise StepError(f"train_step must yield (name, Mean) pairs for the optimizers {names}, in that order")
    return check_train_value(given[1], stage.name)


def check_all_used(steps: list[Iterator[tuple[str, Mean]]], stages: list[Stage]) -> None:
    """A step that yields more losses than there are optimizers has a loss nothing trains on."""
    for losses in steps:
        if next(losses, None) is not None:
            raise StepError(f"train_step yielded more losses than optim.py has optimizers ({len(stages)})")


def build_stages(
    optimizers: object, schedulers: object, wrapped: dict[str, nn.Module], config: TrainConfig, runtime: Runtime
) -> list[Stage]:
    """One stage per optimizer from optim.py, in its order, with the wrapped models it updates."""
    optimizers = optimizers if isinstance(optimizers, dict) else {"model": optimizers}
    schedulers = schedulers if isinstance(schedulers, dict) else {"model": schedulers}
    if list(schedulers) != list(optimizers):
        raise DataError(
            f"optim.py: build_scheduler returned schedules for {list(schedulers)}; "
            f"the optimizers are {list(optimizers)}"
        )
    for schedule in schedulers.values():
        check_floor(schedule, config.min_lr)
    stages = []
    for name, optimizer in optimizers.items():
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise DataError(
                f"optim.py: build_optimizer must return an optimizer or a dict of them; {name!r} is {optimizer!r}"
            )
        owned = {id(param) for group in optimizer.param_groups for param in group["params"]}
        models = [model for model in wrapped.values() if any(id(param) in owned for param in model.parameters())]
        scaler = torch.amp.GradScaler(runtime.device.type, enabled=config.precision == "fp16")
        guard = NonFiniteGuard(config.nan_policy, config.max_consecutive_skips, runtime.is_main)
        stages.append(Stage(name, optimizer, schedulers[name], scaler, models, guard))  # type: ignore[arg-type]
    in_an_optimizer = {id(param) for stage in stages for param in stage.params}
    for name, model in wrapped.items():
        if any(param.requires_grad and id(param) not in in_an_optimizer for param in model.parameters()):
            raise DataError(
                f"model.py's {name!r} has trainable weights that no optimizer in optim.py updates; add them, or "
                "freeze them with requires_grad_(False)"
            )
    return stages


def loss_name(split: str, stage: Stage, stages: list[Stage]) -> str:
    """`train_loss` with one optimizer, `train_<name>_loss` for each of several."""
    return f"{split}_loss" if len(stages) == 1 else f"{split}_{stage.name}_loss"


def grad_norms(stages: list[Stage]) -> dict[str, float]:
    """Each stage's gradient norm at its last update, before clipping: `grad_norm`, or `grad_norm_<name>`
    for each of several optimizers. Known when clipping (--max-grad-norm) or --nan-policy skip computes it."""
    norms = {}
    for stage in stages:
        if stage.grad_norm is not None:
            norms["grad_norm" if len(stages) == 1 else f"grad_norm_{stage.name}"] = float(stage.grad_norm)
    return norms


def mean_losses(split: str, stages: list[Stage], sums: list[list[float]]) -> dict[str, float]:
    """Each stage's mean loss from its summed [total, weight], under its log name; NaN where nothing counted."""
    means = [total / weight if weight else math.nan for total, weight in sums]
    return {loss_name(split, stage, stages): mean for stage, mean in zip(stages, means, strict=True)}


def check_finite(losses: dict[str, float], sums: list[list[float]], where: str) -> dict[str, float]:
    """The training losses from `mean_losses`, if finite; NaN where nothing counted (--nan-policy skip
    dropped every update) is not a diverged loss."""
    for loss, (_, weight) in zip(losses.values(), sums, strict=True):
        if weight and not math.isfinite(loss):
            raise TrainingError(
                f"training loss is {loss} at {where}; lower --lr, check your data for NaN/inf, or use --precision fp32"
            )
    return losses


def stages_state(stages: list[Stage]) -> dict[str, Any]:
    """What a checkpoint holds of the stages besides the optimizers: schedules, fp16 scalers, NaN counters."""
    return {
        "skips_in_a_row": {stage.name: stage.nan_guard.consecutive for stage in stages},
        "schedulers": {stage.name: stage.scheduler.state_dict() for stage in stages},
        "scalers": {stage.name: stage.scaler.state_dict() for stage in stages},
    }


def load_stages_state(stages: list[Stage], state: dict[str, Any]) -> None:
    """Restore what `stages_state` saved."""
    for stage in stages:
        stage.scheduler.load_state_dict(state["schedulers"][stage.name])
        stage.scaler.load_state_dict(state["scalers"][stage.name])
        stage.nan_guard.consecutive = state.get("skips_in_a_row", {}).get(stage.name, 0)
