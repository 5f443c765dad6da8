"""Penalties that layers add to the loss (weight and activity regularizers, add_loss) train exactly
as the same penalties written into step.py's loss by hand: a weight penalty counts once per update,
and a penalty that Keras averages over the batch becomes its mean over the whole global batch
(docs/semantics.md). A strategy with several replicas also trains them alike on two, in
test_distributed.py.
"""

import pytest
from conftest import (
    assert_same_weights,
    edited_sources,
    final_weights,
    finish,
    sources_with_penalties,
    start_training,
)

# 25 global batches of 40 and a short one of 7, which --grad-accum-steps 2 cuts into micro-batches
# of 3 and 4 samples: their penalties must count 3:4.
FLAGS = ("--epochs", "1", "--global-batch-size", "40")
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
    """The penalized model (conftest.PENALIZED_LAYERS), and the same model with its penalties at zero
    whose step adds them by hand, trained together."""
    root = tmp_path_factory.mktemp("penalized")
    sources = sources_with_penalties(root)
    by_hand = edited_sources(root / "zero", "model.py", "STRENGTH = 0.01", "STRENGTH = 0.0", sources)
    by_hand = edited_sources(root / "by_hand_step", "step.py", DEFAULT_STEP, BY_HAND_STEP, by_hand)
    started = {
        "by_hand": start_training(root / "by_hand", *FLAGS, sources=by_hand),
        "one": start_training(root / "one", *FLAGS, "--grad-accum-steps", "2", sources=sources),
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
