"""The models of a run as the loop uses them: split, compiled, recomputed, autocast.

Managed by the looptpl template: edit model.py instead.
"""

import contextlib
import functools
import typing
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import TrainConfig
from .errors import ConfigError, DataError, user_code_error

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


def checkpoint_activations(model: nn.Module, checkpoint_units: Callable[[nn.Module], list[nn.Module]] | None) -> None:
    """--activation-checkpointing: the blocks of model.py's `checkpoint_units` run twice.

    Each block keeps only its inputs for the backward pass, which runs the block's forward again to
    get the rest: the activations of the blocks' inputs plus one block at a time, for about one more
    forward pass of compute. checkpoint() saves the random state before the forward and restores it
    for the second run, so dropout draws the same masks twice (on a GPU, for the devices of the
    tensors passed to the block positionally). The blocks keep their names: checkpoints are alike.
    """
    if checkpoint_units is None:  # a model.py written before the flag existed
        raise ConfigError(
            "--activation-checkpointing recomputes the blocks that checkpoint_units(model) in model.py returns, "
            "and model.py has none; add it (docs/speed.md shows one), or train without the flag"
        )
    try:
        blocks = checkpoint_units(model)
    except Exception as error:
        raise user_code_error(error, "in checkpoint_units") from None
    problem = "got an empty list" if isinstance(blocks, list | tuple) and not blocks else blocks_problem(model, blocks)
    if problem:
        raise DataError(f"model.py: checkpoint_units(model) must return a list of the model's blocks; {problem}")
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)  # type: ignore[method-assign]


def blocks_problem(model: nn.Module, blocks: object, nested: bool = False) -> str:
    """What is wrong with a list of the model's blocks that model.py gives, in words; empty when
    nothing is. `nested`: a block may hold another (blocks wrapped one by one, the inner one first)."""
    if not isinstance(blocks, list | tuple):
        return f"got {type(blocks).__name__}"
    submodules = {id(module) for module in model.modules()}
    for block in blocks:
        name = type(block).__name__
        if not isinstance(block, nn.Module) or id(block) not in submodules:
            return f"got a {name} that is not part of the model"
        if nested and block is model:  # the root is wrapped anyway
            return f"got the {name} itself: return the blocks in it"
        if type(block).forward is nn.Module.forward:  # a ModuleList: never called itself
            return f"got a {name}, which has no forward of its own: return the blocks in it, list(model.blocks)"
        inside = {id(module) for module in block.modules() if module is not block}
        if sum(other is block for other in blocks) > 1:
            return f"got a {name} twice{'' if nested else ', or inside another block'}: return each block once"
        if not nested and any(id(other) in inside for other in blocks):
            return f"got a {name} twice, or inside another block: return each block once"
    return ""


def split_models(built: object) -> tuple[dict[str, nn.Module], dict[str, nn.Module]]:
    """model.py's network(s) by name, split into those with trainable weights and frozen ones."""
    named: dict[str, object] = built if isinstance(built, dict) else {"model": built}
    for name, module in named.items():
        if not isinstance(module, nn.Module):
            raise DataError(f"model.py: build_model must return an nn.Module or a dict of them; {name!r} is {module!r}")
    modules = typing.cast(dict[str, nn.Module], named)
    trained = {name: module for name, module in modules.items() if any(p.requires_grad for p in module.parameters())}
    if not trained:
        raise DataError("model.py: build_model returned no trainable weight (every parameter has requires_grad=False)")
    return trained, {name: module for name, module in modules.items() if name not in trained}
