"""What your files use of the template: what a step returns, the schedules.

Managed by the looptpl template. Import these from here, and the config from `kit.config`; the
other modules of `kit` may change between template versions.
"""

from .collect import Mean, evaluation
from .schedules import warmup_schedule

__all__ = ["Mean", "evaluation", "warmup_schedule"]
