"""Your evaluation metrics.

This file is yours: `copier update` keeps your edits here.
"""

import torch

from .kit.api import Gather, Mean


def batch_metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Mean | Gather]:
    """Each metric of one evaluation batch, by name; logged as val_<name> and test_<name>.

    A `Mean` of per-sample values (with `weights=` for per-token values) is averaged over every
    sample of the split, each counted once over all ranks. For metrics that are not a mean (F1,
    AUC), return per-sample rows as `Gather(...)` and compute them in `dataset_metrics`.
    """
    # TODO(metrics): replace or extend.
    return {"accuracy": Mean((outputs.argmax(dim=1) == targets).float())}


def dataset_metrics(means: dict[str, float], gathered: dict[str, torch.Tensor]) -> dict[str, float]:
    """Metrics of a whole split, from its means and the rows of every `Gather` (one per sample,
    in dataset order, from all ranks); logged beside the means. Every rank calls this."""
    return {}
