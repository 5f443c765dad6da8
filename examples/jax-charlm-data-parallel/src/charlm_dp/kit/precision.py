"""--precision: the dtype the forward pass and the loss compute in. Managed by the looptpl template.

Under bf16 the model runs on bfloat16 copies of the weights and of the batch's floating arrays, made inside
the compiled function: the weights the optimizer updates, their gradients (which flow back through the
copies) and the optimizer state stay float32, as do the loop's sums of the losses.
"""

from typing import Any

import jax
import jax.numpy as jnp

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}


def computing_in(precision: str, tree: Any) -> Any:
    """`tree` with its floating arrays in the dtype of `precision` (fp32 leaves everything as it is)."""
    if precision == "fp32":
        return tree
    dtype = DTYPES[precision]
    return jax.tree.map(lambda array: array.astype(dtype) if jnp.issubdtype(array.dtype, jnp.floating) else array, tree)
