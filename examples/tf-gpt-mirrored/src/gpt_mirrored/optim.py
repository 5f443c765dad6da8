"""Your optimizer and learning-rate schedule.

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
) -> keras.optimizers.Optimizer:
    """Build the optimizer; the loop calls this under `strategy.scope()`.

    Leave out `clipnorm` and `global_clipnorm`: the loop clips the gradient summed over every
    replica and micro-step already (--max-grad-norm).
    """
    # epsilon=1e-8 is PyTorch's default (Keras' is 1e-7): the torch and TensorFlow templates then train alike.
    return keras.optimizers.AdamW(learning_rate=schedule, weight_decay=config.weight_decay, epsilon=1e-8)
