"""What your files use of the template: what a step returns, what a hook sees, schedules, frozen weights.

Managed by the looptpl template. Import these from here, and the config from `kit.config`; the
other modules of `kit` may change between template versions.
"""

from .callbacks import Run
from .checkpoint import load_frozen
from .collect import Gather, Mean, evaluation, gather_with_grad
from .schedules import warmup_schedule

__all__ = ["Gather", "Mean", "Run", "evaluation", "gather_with_grad", "load_frozen", "warmup_schedule"]
