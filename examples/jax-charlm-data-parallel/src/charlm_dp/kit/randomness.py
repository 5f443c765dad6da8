"""Random draws in training that do not depend on how the batch is cut. Managed by the looptpl template.

A random key per sample, derived from (--seed, epoch, the sample's index in the train set) and the draw's
name: the same sample draws the same dropout mask on any number of devices or processes, with any
--grad-accum-steps, and in a resumed run. (A key per batch, or Flax's `nnx.Rngs` streams, which advance
at every call, give masks that change with the batch's shape and with the number of micro-steps.)
"""

import contextlib
import contextvars
import zlib
from collections.abc import Iterator

import jax
import jax.numpy as jnp

_KEYS: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar("keys", default=None)


@contextlib.contextmanager
def sample_keys_of(seed: int, epoch: jax.Array, indices: jax.Array) -> Iterator[None]:
    """While a training micro-step is traced: the keys of its samples (`indices` in the train set)."""
    epoch_key = jax.random.fold_in(jax.random.key(seed), epoch)
    token = _KEYS.set(jax.vmap(lambda index: jax.random.fold_in(epoch_key, index))(indices))
    try:
        yield
    finally:
        _KEYS.reset(token)


def sample_keys(name: str) -> jax.Array | None:
    """One key per sample of the micro-batch being trained, for the draw `name` (each draw site its own),
    or None outside training (evaluation draws nothing)."""
    keys = _KEYS.get()
    if keys is None:
        return None
    salt = zlib.crc32(name.encode()) & 0x7FFFFFFF
    return jax.vmap(lambda key: jax.random.fold_in(key, salt))(keys)


def dropout(inputs: jax.Array, rate: float, name: str) -> jax.Array:
    """Dropout in training (each sample its own mask, from its key for `name`), nothing in evaluation.
    The first dimension of `inputs` is the samples."""
    keys = sample_keys(name)
    if keys is None or rate == 0.0:
        return inputs
    keep = jax.vmap(lambda key, row: jax.random.bernoulli(key, 1.0 - rate, row.shape))(keys, inputs)
    return jnp.where(keep, inputs / (1.0 - rate), 0.0)
