"""What step.py returns, and how the loop averages it. Managed by the looptpl template.

A step returns values and says how much each one counts; the loop does the averaging, over the whole
global batch (every device, every accumulation micro-step) in training and over every sample of a
split in evaluation. Returning the average of a micro-batch instead would weigh a short or sparse
micro-batch like a full one: the classic gradient-accumulation bug.
"""

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from .errors import StepError

# The rows of the batch being traced that are samples (1) and not padding (0): the loop pads the last,
# short batch of a split to the compiled shape, and every Mean leaves the padding out.
_ROWS: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar("rows", default=None)


class Mean:
    """Values to average, each counting `weights` times: `sum(values * weights) / sum(weights)`.

    `Mean(per_sample_losses)` is the mean over samples; `Mean(token_losses, weights=mask)` the mean
    over the real (unmasked) tokens of the global batch; `per` names what one unit of weight is. The
    first dimension of `values` is the batch's samples.
    """

    def __init__(self, values: jax.Array, weights: jax.Array | None = None, per: str = "sample") -> None:
        if not isinstance(values, jax.Array) or values.ndim == 0:
            raise StepError(
                f"Mean() takes one value per sample (or per token), got {_describe(values)}; do not average "
                "over the batch: the loop averages over the whole global batch"
            )
        if weights is not None and (not isinstance(weights, jax.Array) or weights.shape != values.shape):
            raise StepError(
                f"Mean(values, weights): weights must have the shape of values, {list(values.shape)}, "
                f"got {_describe(weights)}"
            )
        weights = jnp.ones(values.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
        rows = _ROWS.get()
        if rows is not None:
            if values.shape[0] != rows.shape[0]:
                raise StepError(
                    f"Mean() got {values.shape[0]} values along the first dimension for a batch of {rows.shape[0]} "
                    "samples; give one value (or one row of values) per sample"
                )
            weights = weights * rows.reshape(rows.shape + (1,) * (values.ndim - 1))
        self.total = (values.astype(jnp.float32) * weights).sum()
        self.weight = weights.sum()
        self.per = per


@dataclasses.dataclass
class Gather:
    """Per-sample rows (first dimension: samples) that evaluation collects over the whole split.

    For metrics that are not a mean over samples (F1, AUC, a confusion matrix): metrics.py's
    `dataset_metrics` receives every sample's row exactly once, in dataset order, from every device
    and process.
    """

    rows: jax.Array


@contextlib.contextmanager
def only_rows(rows: jax.Array) -> Iterator[None]:
    """While the step is traced: the Means it builds count the rows where `rows` is 1, not the padding."""
    token = _ROWS.set(rows)
    try:
        yield
    finally:
        _ROWS.reset(token)


def evaluation(loss: Mean, metrics: dict[str, Mean | Gather]) -> dict[str, Mean | Gather]:
    """The loss and the metrics of an evaluation batch in one dict; a metric may not be named `loss`."""
    if "loss" in metrics:
        raise StepError("metrics.py returns a metric named 'loss', which would replace the loss; rename the metric")
    return {"loss": loss, **metrics}


def stage_loss(result: object, stages: list[str] | None, stage: int) -> Mean:
    """The loss of stage number `stage` in what train_step gave: the Mean it returned with one optimizer; with
    several (`stages`, optim.py's names in order), the Mean of its `stage`-th `yield name, Mean(...)`."""
    if stages is None:
        if not isinstance(result, Mean):
            raise StepError(f"train_step must return a Mean, got {_describe(result)}; wrap the loss in Mean()")
        return result
    if not isinstance(result, Iterator):
        raise StepError(
            f"optim.py builds {len(stages)} optimizers ({', '.join(stages)}): train_step must yield one "
            f"`name, Mean(...)` for each, in that order; it returned {_describe(result)}"
        )
    order = f"optim.py's order: {', '.join(stages)}"
    for index, pair in enumerate(result):
        name = pair[0] if isinstance(pair, tuple) and len(pair) == 2 else None
        if name != stages[index]:
            got, expected = repr(name) if name is not None else _describe(pair), stages[index]
            raise StepError(f"train_step's yield number {index + 1} gave {got}; yield {expected!r}, Mean() ({order})")
        if not isinstance(pair[1], Mean):
            raise StepError(f"train_step yielded {name!r} with {_describe(pair[1])}; yield {name!r}, Mean(...)")
        if index == stage:
            return pair[1]
    raise StepError(f"train_step stopped before it yielded {stages[stage]!r}; yield one loss per optimizer ({order})")


def check_eval_values(values: object) -> dict[str, Mean | Gather]:
    """What eval_step returned: a dict of Mean or Gather values with names usable in the logs."""
    if not isinstance(values, dict) or not values:
        raise StepError(f"eval_step must return a dict of Mean (or Gather) values, got {_describe(values)}")
    for name, value in values.items():
        if name == "samples" or not isinstance(name, str):
            raise StepError(f"eval_step returned a value named {name!r}; the logs use that name, choose another")
        if not isinstance(value, Mean | Gather):
            raise StepError(
                f"eval_step (step.py, metrics.py) returned {name!r} as {_describe(value)}; return a Mean or a Gather"
            )
        if isinstance(value, Gather) and (not isinstance(value.rows, jax.Array) or value.rows.ndim == 0):
            raise StepError(f"Gather {name!r} takes one row per sample, got {_describe(value.rows)}")
    return values


def check_dataset_figures(figures: object, means: dict[str, Any]) -> dict[str, float]:
    """What metrics.py's dataset_metrics returned: a dict of new names (not those of `means`), each a number."""
    if not isinstance(figures, dict):
        raise StepError(f"metrics.py: dataset_metrics must return a dict of new names, got {_describe(figures)}")
    if clash := [name for name in figures if name in means or name == "samples"]:
        raise StepError(f"metrics.py: dataset_metrics returns {clash}, names the logs use already; choose others")
    try:
        return {name: float(value) for name, value in figures.items()}
    except (TypeError, ValueError):
        raise StepError(f"metrics.py: dataset_metrics must return a dict of numbers, got {figures!r}") from None


def _describe(value: object) -> str:
    if isinstance(value, jax.Array):
        return f"an array of shape {list(value.shape)}"
    return f"a {type(value).__name__}"
