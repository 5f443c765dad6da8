"""Penalties that layers add to the loss (weight and activity regularizers, add_loss) train exactly
as the same penalties written into step.py's loss by hand: a weight penalty counts once per update,
and a penalty that Keras averages over the batch becomes its mean over the whole global batch
(docs/semantics.md). Two replicas, with and without accumulation, train them exactly like one.
"""

import pytest
from conftest import (
    assert_same_metrics,
    assert_same_weights,
    edited_sources,
    final_weights,
    finish,
    metrics,
    start_training,
)

# 25 global batches of 40 and a short one of 7, which two replicas or --grad-accum-steps 2 cut
# into parts of 3 and 4 samples, and both together into 1, 2, 2 and 2: their penalties must count so.
FLAGS = ("--epochs", "1", "--global-batch-size", "40")
# Every kind of penalty Keras has: kernel and bias regularizers, an activity regularizer, and a
# layer that adds the mean square of its input with add_loss.
PENALTIES = '''STRENGTH = 0.01  # of every penalty of the model


class Smooth(keras.layers.Layer):
    """Passes its input on, adding STRENGTH x its mean square to the loss."""

    def call(self, inputs):
        self.add_loss(STRENGTH * keras.ops.mean(keras.ops.square(inputs)))
        return inputs


def build_model('''
DEFAULT_LAYERS = (
    '            keras.layers.Dense(64, activation="relu"),\n'
    '            keras.layers.Dense(64, activation="relu"),\n'
    "            keras.layers.Dense(NUM_CLASSES),\n"
)
PENALIZED_LAYERS = (
    "            keras.layers.Dense(\n"
    '                16, activation="relu", kernel_regularizer=keras.regularizers.L2(STRENGTH),\n'
    "                bias_regularizer=keras.regularizers.L1(STRENGTH),\n"
    "            ),\n"
    '            keras.layers.Dense(16, activation="tanh", activity_regularizer=keras.regularizers.L2(STRENGTH)),\n'
    "            Smooth(),\n"
    "            keras.layers.Dense(NUM_CLASSES),\n"
)
DEFAULT_STEP = "    return Mean(per_sample_loss(model(inputs, training=True), targets))"
# The same penalties added to each sample's loss: the mean of a weight penalty that every sample
# carries is that penalty, and Keras divides an activity penalty's sum over a batch by its size.
BY_HAND_STEP = """    first, second, _, last = model.layers
    hidden = second(first(inputs))
    square, strength = keras.ops.square, 0.01
    weights = strength * (keras.ops.sum(square(first.kernel)) + keras.ops.sum(keras.ops.abs(first.bias)))
    activity = strength * keras.ops.sum(square(hidden), axis=1)
    smooth = strength * keras.ops.mean(square(hidden), axis=1)
    return Mean(per_sample_loss(last(hidden), targets) + weights + activity + smooth)"""


@pytest.fixture(scope="module")
def penalized(tmp_path_factory):
    """The penalized model on one replica and on two, and the same model with its penalties at zero
    whose step adds them by hand, trained together."""
    root = tmp_path_factory.mktemp("penalized")
    sources = edited_sources(root / "penalties", "model.py", "def build_model(", PENALTIES)
    sources = edited_sources(root / "layers", "model.py", DEFAULT_LAYERS, PENALIZED_LAYERS, sources)
    by_hand = edited_sources(root / "zero", "model.py", "STRENGTH = 0.01", "STRENGTH = 0.0", sources)
    by_hand = edited_sources(root / "by_hand_step", "step.py", DEFAULT_STEP, BY_HAND_STEP, by_hand)
    started = {
        "by_hand": start_training(root / "by_hand", *FLAGS, sources=by_hand),
        "one": start_training(root / "one", *FLAGS, "--grad-accum-steps", "2", sources=sources),
        "two": start_training(root / "two", *FLAGS, sources=sources, replicas=2),
        "two_accum": start_training(root / "two_accum", *FLAGS, "--grad-accum-steps", "2", sources=sources, replicas=2),
    }
    for training in started.values():
        finish(training)
    return root


def trained_state(run_dir):
    """A run's last checkpoint without its training-loss totals: train_loss logs step.py's loss,
    which holds the penalties only where step.py adds them by hand."""
    return {name: value for name, value in final_weights(run_dir).items() if not name.startswith("running/")}


def test_penalties_train_as_the_loss_they_add(penalized):
    # Were a penalty left out, counted once per micro-step or replica, or an activity penalty
    # averaged per micro-batch, the weights would differ from those of the loss written by hand.
    assert_same_weights(trained_state(penalized / "by_hand"), trained_state(penalized / "one"), atol=1e-5)


@pytest.mark.parametrize("variant", ["two", "two_accum"])
def test_penalties_train_alike_on_two_replicas(penalized, variant):
    assert_same_weights(final_weights(penalized / "one"), final_weights(penalized / variant), atol=1e-5)
    assert_same_metrics(metrics(penalized / "one"), metrics(penalized / variant), rel=1e-4)
