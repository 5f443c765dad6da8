"""Your model.

This file is yours: `copier update` keeps your edits here.
"""

import torch
from torch import nn

from .data import VOCAB_SIZE
from .kit.config import TrainConfig


class CausalTransformer(nn.Module):
    """A small GPT-style model: byte embeddings, learned positions, pre-norm blocks, a byte readout."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB_SIZE, config.width)
        self.position = nn.Embedding(config.max_bytes, config.width)
        block = nn.TransformerEncoderLayer(
            config.width, config.heads, 4 * config.width, config.dropout, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, config.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.width)
        self.readout = nn.Linear(config.width, VOCAB_SIZE)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        hidden = self.embed(input_ids) + self.position(positions)
        # Causal: position t sees positions <= t only.
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=input_ids.device)
        hidden = self.blocks(hidden, mask=mask, is_causal=True)
        return self.readout(self.norm(hidden))


def build_model(config: TrainConfig) -> nn.Module:
    """Build the network on the CPU; the engine moves it to the device and wraps it.

    Every rank builds it with the same seed, so all replicas start from identical weights.
    """
    return CausalTransformer(config)


def checkpoint_units(model: CausalTransformer) -> list[nn.Module]:
    """The blocks --activation-checkpointing runs again in the backward pass: the transformer's layers."""
    return list(model.blocks.layers)
