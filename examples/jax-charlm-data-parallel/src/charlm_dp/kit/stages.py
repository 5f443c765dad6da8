"""Which weights each optimizer trains: the stages of an update. Managed by the looptpl template.

One optimizer (optim.py returns an Optax transformation) trains every weight (`nnx.Param`) of the model.
Several (a dict of them, a GAN's two) are the stages of an update, run in the dict's order: each trains
the part of the model named as it (`model.generator` for the optimizer "generator"), on the weights the
stages before it left. Weights that no optimizer names stay as model.py built them (a frozen judge).
"""

from typing import Any

import numpy as np
import optax
from flax import nnx

from .errors import StepError

# The weights' name with one optimizer: the whole model.
WHOLE = "model"


class Stages:
    """optim.py's optimizers by name, and how the model's state splits into the weights each one trains and
    the rest (what no optimizer trains: frozen weights, BatchNorm's running statistics, Dropout's stream)."""

    def __init__(self, built: object, max_grad_norm: float) -> None:
        several = isinstance(built, dict)
        optimizers: dict[str, Any] = built if several else {WHOLE: built}  # type: ignore[assignment]
        if not optimizers:
            raise StepError("optim.py: build_optimizer returned an empty dict; return at least one optimizer")
        for name, optimizer in optimizers.items():
            if not isinstance(optimizer, optax.GradientTransformation):
                raise StepError(
                    f"optim.py: build_optimizer gave {optimizer!r} for {name!r}; return an Optax transformation "
                    "(optax.adamw(...)), or a dict of them named as the parts of the model they train"
                )
        # One stage each, in order; None with one optimizer (train_step then returns its loss, not a yield).
        self.names: list[str] | None = list(optimizers) if several else None
        if max_grad_norm > 0:  # clip each stage's exact gradient before its optimizer sees it
            clip = optax.clip_by_global_norm(max_grad_norm)
            optimizers = {name: optax.chain(clip, optimizer) for name, optimizer in optimizers.items()}
        self.optimizers: dict[str, optax.GradientTransformation] = optimizers
        if self.names is None:
            self.filters: list[Any] = [nnx.Param]
        else:
            self.filters = [nnx.All(nnx.Param, _part_named(name)) for name in self.names]

    def split(self, model: nnx.Module) -> tuple[nnx.GraphDef, dict[str, nnx.State], nnx.State]:
        """The model's structure, its weights by the optimizer that trains them, and the rest."""
        graphdef, *parts = nnx.split(model, *self.filters, ...)  # type: ignore[misc]
        rest = parts.pop()
        weights = dict(zip(self.optimizers, parts, strict=True))
        for name, part in weights.items():
            if not nnx.to_flat_state(part):
                raise StepError(
                    f"optim.py has an optimizer {name!r} but model.py's model has no part {name!r} with weights; "
                    f"name each optimizer as the part of the model it trains (model.{name})"
                )
        return graphdef, weights, rest  # type: ignore[return-value]

    def zeros(self) -> np.ndarray:
        """Sums of the updates of an epoch, none yet: [sum of w_i l_i, sum of w_i, updates skipped] per stage."""
        return np.zeros((len(self.optimizers), 3))

    def losses(self, sums: np.ndarray) -> dict[str, float]:
        """Each stage's mean loss from its row [sum of w_i l_i, sum of w_i, ...] of `sums`: `train_loss`, or
        `train_<name>_loss` for each of several optimizers."""
        means = sums[:, 0] / np.maximum(sums[:, 1], 1e-12)
        if self.names is None:
            return {"train_loss": float(means[0])}
        return {f"train_{name}_loss": float(mean) for name, mean in zip(self.names, means, strict=True)}


def _part_named(name: str) -> Any:
    """A filter for what lies under the model's attribute (or nnx.Dict key) `name`."""
    return lambda path, value: bool(path) and path[0] == name
