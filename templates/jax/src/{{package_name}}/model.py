"""Your model.

This file is yours: `copier update` keeps your edits here.
"""

import jax
from flax import nnx

from .data import NUM_CLASSES, NUM_FEATURES
from .kit.api import dropout
from .kit.config import TrainConfig


class Classifier(nnx.Module):
    """A small MLP for the synthetic task."""

    def __init__(self, hidden_size: int, rngs: nnx.Rngs) -> None:
        # Under --strategy fsdp each weight is split over the devices along its largest dimension that the
        # device count divides. To choose, annotate it along the mesh's "data" axis, e.g. a kernel by rows:
        # nnx.Linear(..., kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), ("data", None)))
        self.hidden = nnx.Linear(NUM_FEATURES, hidden_size, rngs=rngs)
        self.output = nnx.Linear(hidden_size, NUM_CLASSES, rngs=rngs)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        # kit.api.dropout draws each sample's mask from its own key: the same on any device count.
        return self.output(dropout(nnx.relu(self.hidden(inputs)), 0.1, "hidden"))


def build_model(config: TrainConfig, rngs: nnx.Rngs) -> nnx.Module:
    """Build the network (a Flax NNX module), its weights drawn from `rngs` (seeded from --seed)."""
    # TODO(model): replace with your network; --hidden-size comes from settings.py.
    return Classifier(config.hidden_size, rngs)
