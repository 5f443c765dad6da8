"""Your evaluation metrics.

This file is yours: `copier update` keeps your edits here.
"""

import torch

from .kit.api import Gather, Mean


def batch_metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Mean | Gather]:
    """Each metric of one evaluation batch, by name; logged as val_<name> and test_<name>."""
    return {"accuracy": Mean((outputs.argmax(dim=1) == targets).float())}


def dataset_metrics(means: dict[str, float], gathered: dict[str, torch.Tensor]) -> dict[str, float]:
    """Metrics of a whole split beyond the means: none here."""
    return {}
