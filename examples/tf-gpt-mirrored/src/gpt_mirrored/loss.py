"""Your loss: the cross-entropy of each next byte, and which positions count.

This file is yours: `copier update` keeps your edits here.
"""

import keras
import tensorflow as tf


def per_token_loss(logits: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Each position's cross-entropy, shape [batch, length], and the mask of real tokens (label 0 is padding).

    step.py wraps them in `Mean(losses, weights=mask)`: the engine divides by the real tokens of
    the whole global batch (all replicas, all accumulation steps), so a short or heavily padded
    micro-batch weighs exactly as much as its tokens.
    """
    losses = keras.losses.sparse_categorical_crossentropy(labels, tf.cast(logits, tf.float32), from_logits=True)
    return losses, tf.cast(labels > 0, tf.float32)
