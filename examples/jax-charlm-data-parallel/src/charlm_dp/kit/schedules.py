"""Learning-rate schedules with linear warmup, as Optax schedules. Managed by the looptpl template:
edit optim.py instead."""

import math

import jax.numpy as jnp
import optax


def warmup_schedule(lr: float, name: str, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> optax.Schedule:
    """Linear warmup to `lr` over `warmup_steps` updates, then `cosine` decay to `min_lr` or `constant`;
    the rate of update n (from 0) is the torch backend's, so the backends train alike."""
    floor = min(1.0, min_lr / lr) if lr > 0 else 0.0

    def rate(step: jnp.ndarray) -> jnp.ndarray:
        warmup = (step + 1) / max(1, warmup_steps)
        progress = jnp.minimum(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        decayed = 1.0 if name == "constant" else floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        return lr * jnp.where(step < warmup_steps, warmup, decayed)

    return rate
