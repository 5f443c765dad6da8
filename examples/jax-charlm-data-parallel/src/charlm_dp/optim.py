"""Your optimizer and learning-rate schedule.

This file is yours: `copier update` keeps your edits here.
"""

import optax

from .kit.api import warmup_schedule
from .kit.config import TrainConfig


def build_optimizer(config: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    """The Optax optimizer, its schedule over `total_steps` updates inside. The loop clips the exact
    gradient to --max-grad-norm before it."""
    schedule = warmup_schedule(config.lr, config.schedule, config.warmup_steps, total_steps, min_lr=config.min_lr)
    return optax.adamw(schedule, weight_decay=config.weight_decay)
