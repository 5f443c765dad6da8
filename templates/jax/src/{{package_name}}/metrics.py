"""Your evaluation metrics.

This file is yours: `copier update` keeps your edits here.
"""

import jax
import numpy as np

from .kit.api import Gather, Mean


def batch_metrics(logits: jax.Array, targets: jax.Array) -> dict[str, Mean | Gather]:
    """Each metric of one evaluation batch, by name; logged as val_<name> and test_<name>.

    A `Mean` of per-sample values (with `weights=` for per-token values) is averaged over every sample of
    the split, each counted once. For metrics that are not a mean (F1, AUC), return per-sample rows as
    `Gather(...)` and compute them in `dataset_metrics`.
    """
    # TODO(metrics): replace or extend.
    return {"accuracy": Mean((logits.argmax(axis=-1) == targets).astype("float32"))}


def dataset_metrics(means: dict[str, float], gathered: dict[str, np.ndarray]) -> dict[str, float]:
    """Metrics of a whole split, from its means and the rows of every `Gather` (one per sample, in dataset
    order, from every device and process); logged beside the means. Every process calls this."""
    return {}
