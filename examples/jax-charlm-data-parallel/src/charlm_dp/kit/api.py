"""What your files use of the template: what a step returns, what a hook sees, the schedules, per-sample
random draws.

Managed by the looptpl template. Import these from here, and the config from `kit.config`; the
other modules of `kit` may change between template versions.
"""

from .callbacks import Run
from .collect import Gather, Mean, evaluation
from .randomness import dropout, sample_keys
from .schedules import warmup_schedule

__all__ = ["Gather", "Mean", "Run", "dropout", "evaluation", "sample_keys", "warmup_schedule"]
