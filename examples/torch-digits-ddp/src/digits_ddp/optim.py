"""Your optimizer and learning-rate schedule.

This file is yours: `copier update` keeps your edits here.
"""

import torch
from torch import nn

from .kit.api import warmup_schedule
from .kit.config import TrainConfig


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """Build the optimizer over the (already wrapped) model's parameters."""
    return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """Build the schedule, stepped once per optimizer update (`total_steps` updates in all)."""
    return warmup_schedule(optimizer, config.schedule, config.warmup_steps, total_steps, min_lr=config.min_lr)
