"""Your model: a generator, a discriminator, and a frozen judge that names the digits drawn.

This file is yours: `copier update` keeps your edits here.
"""

import keras
import tensorflow as tf

from .data import NUM_CLASSES, PIXELS, load_images, split_indices
from .kit.config import TrainConfig


def build_generator(config: TrainConfig) -> keras.Model:
    """Noise and a requested digit -> 64 pixels in [-1, 1]."""
    noise, label = keras.Input((config.latent_size,)), keras.Input((), dtype="int32")
    hidden = keras.layers.Concatenate()([noise, keras.layers.Embedding(NUM_CLASSES, config.latent_size)(label)])
    for _ in range(2):
        hidden = keras.layers.LeakyReLU(0.2)(keras.layers.Dense(config.width)(hidden))
    return keras.Model([noise, label], keras.layers.Dense(PIXELS, activation="tanh")(hidden), name="generator")


def build_discriminator(config: TrainConfig) -> keras.Model:
    """64 pixels and the digit they should show -> a logit: real (high) or generated (low)."""
    image, label = keras.Input((PIXELS,)), keras.Input((), dtype="int32")
    hidden = keras.layers.Concatenate()([image, keras.layers.Embedding(NUM_CLASSES, PIXELS)(label)])
    for _ in range(2):
        hidden = keras.layers.LeakyReLU(0.2)(keras.layers.Dense(config.width)(hidden))
    logit = keras.layers.Reshape(())(keras.layers.Dense(1)(hidden))
    return keras.Model([image, label], logit, name="discriminator")


class NearestLabel(keras.layers.Layer):
    """The label of the closest training image (1-nearest neighbour), kept in non-trainable weights."""

    def __init__(self) -> None:
        super().__init__()
        images, labels = load_images()
        train = split_indices()[0]
        self.images = self.add_weight(shape=images[train].shape, trainable=False, name="images")
        self.labels = self.add_weight(shape=labels[train].shape, dtype="int32", trainable=False, name="labels")
        self.images.assign(images[train])
        self.labels.assign(labels[train])

    def call(self, image: tf.Tensor) -> tf.Tensor:
        image = tf.cast(image, tf.float32)
        distances = tf.reduce_sum(self.images**2, axis=1) - 2.0 * tf.matmul(image, self.images, transpose_b=True)
        return tf.gather(self.labels, tf.argmin(distances, axis=1))


def build_judge() -> keras.Model:
    """Names the digit an image shows. It has no trainable weight, so the engine keeps it for
    inference only: in no optimizer, not in the checkpoints. On real held-out digits it is right
    about 98% of the time."""
    image = keras.Input((PIXELS,))
    return keras.Model(image, NearestLabel()(image), name="judge")


def build_model(config: TrainConfig) -> dict[str, keras.Model]:
    """The three networks, by name; step.py receives this dict, optim.py names an optimizer per trained one."""
    return {"discriminator": build_discriminator(config), "generator": build_generator(config), "judge": build_judge()}
