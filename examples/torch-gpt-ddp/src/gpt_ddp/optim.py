"""Your optimizer and learning-rate schedule.

This file is yours: `copier update` keeps your edits here.
"""

import torch
from torch import nn

from .kit.api import warmup_schedule
from .kit.config import TrainConfig


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW as nanoGPT sets it up: weight decay on the matrices (embeddings and linear weights) only,
    none on biases and LayerNorm gains; beta2 0.99, as nanoGPT's small character models use."""
    matrices = [weight for weight in model.parameters() if weight.dim() >= 2]
    vectors = [weight for weight in model.parameters() if weight.dim() < 2]
    groups = [{"params": matrices, "weight_decay": config.weight_decay}, {"params": vectors, "weight_decay": 0.0}]
    on_gpu = config.device != "cpu" and torch.cuda.is_available()
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.99), fused=on_gpu or None)


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warmup over --warmup-steps, then cosine from --lr down to --min-lr at the last update."""
    return warmup_schedule(optimizer, config.schedule, config.warmup_steps, total_steps, min_lr=config.min_lr)
