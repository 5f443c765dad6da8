"""An exponential moving average of the trained weights (--ema-decay), evaluated beside them.

Managed by the looptpl template.

After every update, average = decay * average + (1 - decay) * weights; the first update copies
the weights (as Keras' `use_ema` and torch's `AveragedModel` do). The average is a function of the
updates alone, so a resumed run continues it exactly. Only parameters are averaged: buffers
(batch norm statistics) are the model's own.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from .checkpoint import options_for


class WeightAverage:
    """The moving average of a model's parameters, kept beside them on the same device."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.model = model
        self.decay = decay
        self.parameters = [parameter for parameter in model.parameters() if parameter.is_floating_point()]
        self.average = [weights.clone() for weights in self.weights()]
        self.updates = 0

    def weights(self) -> list[torch.Tensor]:
        """The parameters' values."""
        return [parameter.detach() for parameter in self.parameters]

    @torch.no_grad()
    def update(self) -> None:
        """Fold the weights of the update just applied into the average."""
        torch._foreach_lerp_(self.average, self.weights(), 1.0 if self.updates == 0 else 1.0 - self.decay)
        self.updates += 1

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_in(self) -> Iterator[None]:
        """Inside the block the model holds the average; after it, its own weights again.

        Whatever the block writes into the model's parameters becomes the average.
        """
        weights = self.weights()
        saved = [tensor.clone() for tensor in weights]
        torch._foreach_copy_(weights, self.average)
        try:
            yield
        finally:
            torch._foreach_copy_(self.average, self.weights())
            torch._foreach_copy_(weights, saved)

    def state_dict(self, options: StateDictOptions) -> dict[str, Any]:
        """The average as a state dict of the model, as `options` say: the checkpoint's "ema" entry loads
        into the model like its "model" entry."""
        with self.swapped_in():
            state: dict[str, torch.Tensor] = get_model_state_dict(self.model, options=options)  # type: ignore[assignment]
            # Copies, taken before the weights come back: the state's tensors share the parameters' memory.
            weights = {name: tensor.clone() for name, tensor in state.items()}
        return {"updates": self.updates, "weights": weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.swapped_in():
            set_model_state_dict(self.model, state["weights"], options=options_for(state["weights"]))
        self.updates = state["updates"]
