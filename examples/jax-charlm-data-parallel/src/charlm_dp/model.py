"""Your model.

This file is yours: `copier update` keeps your edits here.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from .data import VOCAB_SIZE
from .kit.api import dropout
from .kit.config import TrainConfig


class Block(nnx.Module):
    """A pre-norm transformer block: causal self-attention, then a 4x MLP, each added to its input."""

    def __init__(self, config: TrainConfig, index: int, rngs: nnx.Rngs) -> None:
        self.attention_norm = nnx.LayerNorm(config.width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(config.heads, config.width, decode=False, keep_rngs=False, rngs=rngs)
        self.mlp_norm = nnx.LayerNorm(config.width, rngs=rngs)
        self.expand = nnx.Linear(config.width, 4 * config.width, rngs=rngs)
        self.project = nnx.Linear(4 * config.width, config.width, rngs=rngs)
        self.rate, self.index = config.dropout, index

    def __call__(self, hidden: jax.Array, mask: jax.Array) -> jax.Array:
        # kit.api.dropout draws each sample's mask from its own key: the same on any number of devices.
        attended = self.attention(self.attention_norm(hidden), mask=mask)
        hidden = hidden + dropout(attended, self.rate, f"attention{self.index}")
        mlp = self.project(nnx.gelu(self.expand(self.mlp_norm(hidden))))
        return hidden + dropout(mlp, self.rate, f"mlp{self.index}")


class CausalTransformer(nnx.Module):
    """A small GPT-style model: byte embeddings, learned positions, pre-norm blocks, a byte readout."""

    def __init__(self, config: TrainConfig, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(VOCAB_SIZE, config.width, rngs=rngs)
        self.position = nnx.Embed(config.max_bytes, config.width, rngs=rngs)
        self.blocks = nnx.List([Block(config, index, rngs) for index in range(config.layers)])
        self.norm = nnx.LayerNorm(config.width, rngs=rngs)
        self.readout = nnx.Linear(config.width, VOCAB_SIZE, rngs=rngs)

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        length = input_ids.shape[1]
        hidden = self.embed(input_ids) + self.position(jnp.arange(length))
        # Causal: position t sees positions <= t only, so the padding at the end of a row is never seen.
        mask = nnx.make_causal_mask(jnp.ones((1, length), bool))
        for block in self.blocks:
            hidden = block(hidden, mask)
        return self.readout(self.norm(hidden))


def build_model(config: TrainConfig, rngs: nnx.Rngs) -> nnx.Module:
    """Build the network, its weights drawn from `rngs` (seeded from --seed): the same on every process."""
    return CausalTransformer(config, rngs)
