"""Your optimizers and learning-rate schedules: one of each per trained network.

This file is yours: `copier update` keeps your edits here.
"""

import torch
from torch import nn

from .kit.api import warmup_schedule
from .kit.config import TrainConfig


def build_optimizer(models: dict[str, nn.Module], config: TrainConfig) -> dict[str, torch.optim.Optimizer]:
    """One Adam per network, with the momentum GANs train with (beta1 = 0.5); step.py steps them in this order."""
    return {
        name: torch.optim.AdamW(models[name].parameters(), lr=config.lr, betas=(0.5, 0.999), weight_decay=0.0)
        for name in ("discriminator", "generator")
    }


def build_scheduler(
    optimizers: dict[str, torch.optim.Optimizer], config: TrainConfig, total_steps: int
) -> dict[str, torch.optim.lr_scheduler.LRScheduler]:
    """A schedule per optimizer, stepped once per update (`total_steps` updates in all)."""
    return {
        name: warmup_schedule(optimizer, config.schedule, config.warmup_steps, total_steps, min_lr=config.min_lr)
        for name, optimizer in optimizers.items()
    }
