"""Random generator states, kept in checkpoints so that a resumed run draws what the uninterrupted
run drew (dropout, augmentation). Managed by the looptpl template.

A checkpoint holds every rank's states, in rank order; a run resumed on as many ranks gives each
rank its own back.
"""

import math
import random

import torch

from ..distributed import Runtime


def state(runtime: Runtime) -> dict[str, torch.Tensor]:
    """This rank's random generators (torch, CUDA, Python's) as tensors."""
    _, python_state, gauss_next = random.getstate()
    generators = {
        "torch": torch.get_rng_state(),
        "python": torch.tensor(python_state, dtype=torch.int64),
        "python_gauss": torch.tensor([math.nan if gauss_next is None else gauss_next], dtype=torch.float64),
    }
    if runtime.device.type == "cuda":
        generators["cuda"] = torch.cuda.get_rng_state(runtime.device)
    return generators


def restore(generators: dict[str, torch.Tensor], runtime: Runtime) -> None:
    """Set this rank's random generators to states `state` returned."""
    torch.set_rng_state(generators["torch"])
    gauss_next = generators["python_gauss"].item()
    random.setstate((3, tuple(generators["python"].tolist()), None if math.isnan(gauss_next) else gauss_next))
    if "cuda" in generators and runtime.device.type == "cuda":
        torch.cuda.set_rng_state(generators["cuda"], runtime.device)
