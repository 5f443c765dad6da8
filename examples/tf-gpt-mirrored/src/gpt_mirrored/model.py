"""Your model: a small causal transformer over bytes.

This file is yours: `copier update` keeps your edits here.
"""

import keras
import tensorflow as tf

from .data import CONTEXT, VOCAB_SIZE
from .kit.config import TrainConfig


class Block(keras.layers.Layer):
    """A pre-norm transformer block: causal self-attention, then a feed-forward layer."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__()
        self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-5)
        # Causal: position t attends to positions <= t only, so it never sees the byte it predicts. No biases
        # (nanoGPT's bias=False): a key bias has no effect on attention, so its gradient is float noise, which
        # Adam would turn into full-size steps that differ between 1 and 2 replicas.
        self.attention = keras.layers.MultiHeadAttention(
            config.heads, config.width // config.heads, dropout=config.dropout, use_bias=False
        )
        self.feed_forward_norm = keras.layers.LayerNormalization(epsilon=1e-5)
        self.feed_forward = keras.Sequential(
            [keras.layers.Dense(4 * config.width, activation="gelu"), keras.layers.Dense(config.width)]
        )
        self.dropout = keras.layers.Dropout(config.dropout)

    def call(self, hidden: tf.Tensor, training: bool = False) -> tf.Tensor:
        normed = self.attention_norm(hidden)
        attended = self.attention(normed, normed, use_causal_mask=True, training=training)
        hidden = hidden + self.dropout(attended, training=training)
        return hidden + self.dropout(self.feed_forward(self.feed_forward_norm(hidden)), training=training)


class Embed(keras.layers.Layer):
    """Each byte's embedding plus its position's (learned, for the CONTEXT positions of a window)."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__()
        self.tokens = keras.layers.Embedding(VOCAB_SIZE, config.width)
        self.positions = keras.layers.Embedding(CONTEXT, config.width)

    def call(self, tokens: tf.Tensor) -> tf.Tensor:
        return self.tokens(tokens) + self.positions(tf.range(tf.shape(tokens)[1]))


def build_model(config: TrainConfig) -> keras.Model:
    """Byte embeddings and positions, `--layers` blocks, a byte readout: logits for every position."""
    tokens = keras.Input((None,), dtype="int32")
    hidden = Embed(config)(tokens)
    for _ in range(config.layers):
        hidden = Block(config)(hidden)
    hidden = keras.layers.LayerNormalization(epsilon=1e-5)(hidden)
    return keras.Model(tokens, keras.layers.Dense(VOCAB_SIZE)(hidden), name="gpt")
