"""Learning-rate schedules with linear warmup. Managed by the looptpl template: edit optim.py instead."""

import math

import torch


def warmup_schedule(
    optimizer: torch.optim.Optimizer, name: str, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to the base rate over `warmup_steps`, then `cosine` decay to 0 or `constant`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if name == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
