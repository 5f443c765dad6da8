"""One optimizer update from a rank's micro-batches: the exact global-batch loss scaling.

Managed by the looptpl template: put your own code in step.py and optim.py.
"""

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from . import distributed
from . import model as model_file
from .collect import Mean, check_train_value
from .config import TrainConfig
from .distributed import Runtime
from .ema import WeightAverage
from .errors import ConfigError, DataError, StepError, user_code_error
from .profiling import UpdateProfiler
from .stages import Stage, only_training
from .step import train_step

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_autocast(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """What the forward passes run under for --precision: autocast to bf16/fp16, or nothing for fp32."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


def compile_model(model: nn.Module, config: TrainConfig) -> nn.Module:
    """The model compiled for --compile (in --compile-mode), or as it is."""
    return torch.compile(model, mode=config.compile_mode) if config.compile else model  # type: ignore[return-value]


def checkpoint_activations(model: nn.Module) -> None:
    """--activation-checkpointing: the blocks of model.py's `checkpoint_units` run twice.

    Each block keeps only its inputs for the backward pass, which runs the block's forward again to
    get the rest: the activations of the blocks' inputs plus one block at a time, for about one more
    forward pass of compute. checkpoint() saves the random state before the forward and restores it
    for the second run, so dropout draws the same masks twice (on a GPU, for the devices of the
    tensors passed to the block positionally). The blocks keep their names: checkpoints are alike.
    """
    checkpoint_units = getattr(model_file, "checkpoint_units", None)
    if checkpoint_units is None:  # a model.py written before the flag existed
        raise ConfigError(
            "--activation-checkpointing recomputes the blocks that checkpoint_units(model) in model.py returns, "
            "and model.py has none; add it (docs/speed.md shows one), or train without the flag"
        )
    try:
        blocks = checkpoint_units(model)
    except Exception as error:
        raise user_code_error(error, "in checkpoint_units") from None
    problem = checkpoint_units_problem(model, blocks)
    if problem:
        raise DataError(f"model.py: checkpoint_units(model) must return a list of the model's blocks; {problem}")
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)  # type: ignore[method-assign]


def checkpoint_units_problem(model: nn.Module, blocks: object) -> str:
    """What is wrong with `checkpoint_units`' answer, in words; empty when nothing is."""
    if not isinstance(blocks, list | tuple):
        return f"got {type(blocks).__name__}"
    if not blocks:
        return "got an empty list"
    submodules = {id(module) for module in model.modules()}
    for block in blocks:
        name = type(block).__name__
        if not isinstance(block, nn.Module) or id(block) not in submodules:
            return f"got a {name} that is not part of the model"
        if type(block).forward is nn.Module.forward:  # a ModuleList: never called itself
            return f"got a {name}, which has no forward of its own: return the blocks in it, list(model.blocks)"
        inside = {id(module) for module in block.modules() if module is not block}
        if any(id(other) in inside for other in blocks) or sum(other is block for other in blocks) > 1:
            return f"got a {name} twice, or inside another block: return each block once"
    return ""


class TrainStep:
    """Runs step.py's `train_step` on the micro-batches of an update and applies each stage's update."""

    def __init__(
        self,
        config: TrainConfig,
        runtime: Runtime,
        models: Any,
        stages: list[Stage],
        autocast: Callable[[], contextlib.AbstractContextManager[None]],
        ema: WeightAverage | None,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.models = models  # what step.py receives: one module, or the dict of them
        self.stages = stages
        self.autocast = autocast
        self.ema = ema  # --ema-decay: averaged after every update applied
        self.profiler = UpdateProfiler(config.profile, Path(config.run_dir), runtime)  # --profile
        self.per = "sample"  # what one unit of the first optimizer's loss weight is (Mean's `per`)

    def __call__(self, micro_batches: list[Any], where: str) -> tuple[torch.Tensor, bool]:
        """One optimizer update per stage from this rank's micro-batches; `where` names it in messages.

        Returns this rank's [loss total, weight] per stage, and whether any stage applied its update.

        The update must follow the gradient of the global mean loss, sum_i(w_i l_i) / sum_i(w_i), over
        every rank and micro-step. The weight sum is only known once every micro-step has run, so each
        backward uses a fixed multiplier c = W / --global-batch-size instead (with one loss per
        sample that is already the right scale), and DDP/FSDP then average the W ranks' gradients:
        (c / W) * sum_i grad(w_i l_i). One multiplication by --global-batch-size / sum_i(w_i),
        all-reduced on the device (no host synchronization), gives the exact mean: for a short last
        batch, padded tokens or masks alike. With one loss per sample and a full batch it is exactly 1.
        """
        for stage in self.stages:
            for model in stage.models:
                distributed.check_trainable(model)  # hooks run between updates
        multiplier = self.runtime.world_size / self.config.global_batch_size
        # A micro-batch's step runs up to its first loss. With several optimizers, step.py yields one
        # loss per stage and is resumed stage by stage, after the previous stage's optimizer stepped.
        steps = [self._losses(batch) for batch in micro_batches]
        totals = torch.zeros(len(self.stages), 2, dtype=torch.float64, device=self.runtime.device)
        applied = False
        for index, stage in enumerate(self.stages):
            with only_training(stage, self.stages) if len(self.stages) > 1 else contextlib.nullcontext():
                for micro_step, losses in enumerate(steps):
                    # Gradients are synchronized across ranks only on an update's last micro-step.
                    with stage.gradient_sync(enabled=micro_step == len(steps) - 1):
                        with self.autocast():
                            loss = self._next_loss(losses, stage)
                        stage.scaler.scale(loss.total * multiplier).backward()
                    self.per = loss.per if index == 0 else self.per
                    totals[index, 0] += loss.total.detach()
                    totals[index, 1] += loss.weight
            weight = distributed.all_reduce_sum(totals[index, 1].clone())
            factor = (self.config.global_batch_size / weight.clamp_min(1e-12)).float()
            if stage.step(factor, self.config.max_grad_norm, where):
                applied = True
            else:  # --nan-policy skip dropped it: its loss is left out of train_loss
                totals[index] = 0.0
        for losses in steps:
            if next(losses, None) is not None:
                raise StepError(f"train_step yielded more losses than optim.py has optimizers ({len(self.stages)})")
        if applied and self.ema is not None:
            self.ema.update()
        self.profiler.step()
        return totals, applied

    def _losses(self, batch: Any) -> Iterator[tuple[str, Mean]]:
        """step.py's losses for one micro-batch, one per stage; nothing runs before the first is asked for."""
        result = train_step(self.models, batch, self.config)
        if isinstance(result, Iterator):
            yield from result
        else:
            yield self.stages[0].name, result

    def _next_loss(self, losses: Iterator[tuple[str, Mean]], stage: Stage) -> Mean:
        try:
            given = next(losses)
        except StopIteration:
            raise StepError(f"train_step yielded no loss for optimizer {stage.name!r} of optim.py") from None
        except Exception as error:
            raise user_code_error(error, "in train_step") from None
        if not (isinstance(given, tuple) and len(given) == 2) or (len(self.stages) > 1 and given[0] != stage.name):
            names = [stage.name for stage in self.stages]
            raise StepError(f"train_step must yield (name, Mean) pairs for the optimizers {names}, in that order")
        return check_train_value(given[1], stage.name)
