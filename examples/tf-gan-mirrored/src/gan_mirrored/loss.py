"""Your losses: how far the discriminator's scores are from "real" or "generated".

This file is yours: `copier update` keeps your edits here.
"""

import tensorflow as tf


def scored_as(scores: tf.Tensor, real: bool) -> tf.Tensor:
    """Binary cross-entropy of each score against one label (real = 1, generated = 0), one value per image."""
    scores = tf.cast(scores, tf.float32)
    labels = tf.ones_like(scores) if real else tf.zeros_like(scores)
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=scores)
