"""Learning-rate schedules with linear warmup. Managed by the looptpl template: edit optim.py instead."""

import math
from typing import Any, TypeVar

import keras
import tensorflow as tf

from .errors import DataError


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak_lr` over `warmup_steps`, then `cosine` decay to `min_lr` (--min-lr) or `constant`.

    Keras calls it with the optimizer's update count before each update, so update k (from 0)
    uses peak_lr * (k + 1) / warmup_steps during warmup.
    """

    def __init__(self, peak_lr: float, shape: str, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> None:
        self.peak_lr = peak_lr
        self.min_lr = min_lr
        self.shape = shape
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step: Any) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        warmup = tf.minimum(1.0, (step + 1.0) / max(1, self.warmup_steps))
        if self.shape == "constant":
            return self.peak_lr * warmup
        progress = tf.clip_by_value((step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps), 0, 1)
        cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
        return warmup * (self.min_lr + (self.peak_lr - self.min_lr) * cosine)

    def get_config(self) -> dict[str, Any]:
        return {
            "peak_lr": self.peak_lr,
            "shape": self.shape,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "min_lr": self.min_lr,
        }


Schedule = TypeVar("Schedule")


def check_floor(schedule: Schedule, min_lr: float) -> Schedule:
    """The schedule optim.py built, refused if it is the template's and does not end at --min-lr:
    an optim.py written before that flag existed does not pass it on, and the flag would change nothing."""
    floor = getattr(schedule, "min_lr", min_lr)  # a schedule of your own has none: yours to use --min-lr
    if floor != min_lr:
        raise DataError(
            f"optim.py: the template's schedule ends at min_lr={floor}, but --min-lr is {min_lr}: "
            "pass min_lr=config.min_lr where optim.py builds it"
        )
    return schedule
