"""What your files use of the template: the values a step returns, what a hook sees, the schedules.

Managed by the looptpl template. Import these from here, and the config from `kit.config`; the
other modules of `kit` may change between template versions.
"""

from .callbacks import Run
from .collect import Gather, Mean, evaluation
from .schedules import warmup_schedule

__all__ = ["Gather", "Mean", "Run", "evaluation", "warmup_schedule"]
