"""Your loss, per sample.

This file is yours: `copier update` keeps your edits here.
"""

import jax
import optax


def per_sample_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """One loss value per sample: the loop averages them over the whole global batch."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets)
