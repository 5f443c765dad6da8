"""What your files use of the template: what a step returns, what a hook sees, the schedules.

Managed by the looptpl template. Import these from here, and the config from `kit.config`; the
other modules of `kit` may change between template versions.
"""

from .callbacks import Run
from .collect import Gather, Mean, evaluation, gather_with_grad
from .schedules import WarmupSchedule

__all__ = ["Gather", "Mean", "Run", "WarmupSchedule", "evaluation", "gather_with_grad"]
