"""Your evaluation metrics.

This file is yours: `copier update` keeps your edits here.
"""

import numpy as np
import tensorflow as tf

from .kit.api import Gather, Mean


def batch_metrics(outputs: tf.Tensor, targets: tf.Tensor) -> dict[str, Mean | Gather]:
    """Each metric of one evaluation batch, by name; logged as val_<name> and test_<name>.

    A `Mean` of per-sample values (with `weights=` for per-token values) is averaged over every
    sample of the split, each counted once over all replicas. For metrics that are not a mean (F1,
    AUC), return per-sample rows as `Gather(...)` and compute them in `dataset_metrics`.
    """
    predictions = tf.argmax(outputs, axis=1, output_type=targets.dtype)
    return {"accuracy": Mean(tf.cast(predictions == targets, tf.float32))}


def dataset_metrics(means: dict[str, float], gathered: dict[str, np.ndarray]) -> dict[str, float]:
    """Metrics of a whole split, from its means and the rows of every `Gather` (one per sample,
    in dataset order, from all replicas); logged beside the means. Every worker calls this."""
    return {}
