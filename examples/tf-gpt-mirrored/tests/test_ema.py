"""The moving average of the weights (--ema-decay, ema.py): Keras' own, as the loop sets it up, follows
its formula and is swapped into the model and out.

Its exact resume is tested by the runs that resume and compare with an uninterrupted run: TRAIN_FLAGS
(conftest.py) sets --ema-decay.
"""

import keras
import numpy as np
import tensorflow as tf

from gpt_mirrored.kit.ema import WeightAverage, keep_average


def test_the_weight_average_follows_its_formula_and_is_swapped_in_and_out():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)
    keep_average(optimizer, 0.75)
    optimizer.build(model.trainable_variables)
    expected: list = []
    for update in range(3):
        gradients = [tf.random.normal(variable.shape) for variable in model.trainable_variables]
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        weights = [variable.numpy() for variable in model.trainable_variables]
        # The first update copies the weights; then average = 0.75 * average + 0.25 * weights.
        if update == 0:
            expected = weights
        else:
            expected = [0.75 * old + 0.25 * new for old, new in zip(expected, weights, strict=True)]
    with WeightAverage([(optimizer, model.trainable_variables)]).swapped_in():
        for variable, value in zip(model.trainable_variables, expected, strict=True):
            np.testing.assert_allclose(variable.numpy(), value, rtol=1e-6)
    for variable, value in zip(model.trainable_variables, weights, strict=True):  # the model's own weights again
        np.testing.assert_array_equal(variable.numpy(), value)
