"""Your evaluation metrics.

This file is yours: `copier update` keeps your edits here.
"""

import math

import jax
import numpy as np

from .kit.api import Gather, Mean


def batch_metrics(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> dict[str, Mean | Gather]:
    """Each metric of one evaluation batch: how often the next byte is guessed right, per real token."""
    return {"accuracy": Mean((logits.argmax(axis=-1) == labels).astype("float32"), weights=mask, per="token")}


def dataset_metrics(means: dict[str, float], gathered: dict[str, np.ndarray]) -> dict[str, float]:
    """Perplexity: e to the mean loss per real token of the whole split (not a mean of per-batch values)."""
    return {"perplexity": math.exp(means["loss"])}
