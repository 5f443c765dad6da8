"""Your optimizers and learning-rate schedule: one optimizer per trained network.

This file is yours: `copier update` keeps your edits here.
"""

import keras

from .kit.api import WarmupSchedule
from .kit.config import TrainConfig


def build_schedule(config: TrainConfig, total_steps: int) -> keras.optimizers.schedules.LearningRateSchedule:
    """Build the learning rate as a function of the optimizer updates done (`total_steps` in all)."""
    return WarmupSchedule(config.lr, config.schedule, config.warmup_steps, total_steps, min_lr=config.min_lr)


def build_optimizer(
    config: TrainConfig, schedule: keras.optimizers.schedules.LearningRateSchedule
) -> dict[str, keras.optimizers.Optimizer]:
    """One Adam per network, named as in model.py, with the momentum GANs train with (beta_1 = 0.5);
    step.py yields their losses in this order."""
    return {
        name: keras.optimizers.Adam(learning_rate=schedule, beta_1=0.5, epsilon=1e-8)
        for name in ("discriminator", "generator")
    }
