"""What step.py returns, and how the loop averages it. Managed by the looptpl template.

A step returns values and says how much each one counts; the loop does the averaging, over
the whole global batch (every rank, every accumulation micro-step) in training and over every
sample of a split in evaluation. Returning the average of a micro-batch instead would weigh a
short or sparse micro-batch like a full one: the classic gradient-accumulation bug.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_gather as all_gather_with_autograd

from .errors import StepError


@dataclass(init=False)
class Mean:
    """Values to average, each counting `weights` times: `sum(values * weights) / sum(weights)`.

    `Mean(per_sample_losses)` is the mean over samples; `Mean(token_losses, weights=mask)` the mean
    over the real (unmasked) tokens of the global batch; `per` names what one unit of weight is,
    and the logs count those units (`train_tokens`).
    """

    total: torch.Tensor  # sum(values * weights), a scalar
    weight: torch.Tensor  # sum(weights), a scalar
    count: float | None  # the weight known on the host, without weights (how many values): None with them
    per: str
    dtype: torch.dtype  # of the values as given: a loss must be floating point to have a gradient

    def __init__(self, values: torch.Tensor, weights: torch.Tensor | None = None, per: str = "sample") -> None:
        if not isinstance(values, torch.Tensor) or values.dim() == 0:
            raise StepError(
                f"Mean() takes one value per sample (or per token), got {_describe(values)}; do not average "
                "over the batch (use reduction='none'): the loop averages over the whole global batch"
            )
        if weights is None:
            # Filled on the device: torch.tensor(n, device=...) would copy it from the host at every micro-step.
            self.count = float(values.numel())
            self.total, self.weight = values.sum(), torch.full((), self.count, device=values.device)
        else:
            if not isinstance(weights, torch.Tensor) or weights.shape != values.shape:
                raise StepError(
                    f"Mean(values, weights): weights must have the shape of values, {list(values.shape)}, "
                    f"got {_describe(weights)}"
                )
            weights = weights.to(values.dtype if values.is_floating_point() else torch.float32)
            self.total, self.weight, self.count = (values * weights).sum(), weights.detach().sum(), None
        self.per, self.dtype = per, values.dtype


@dataclass
class Gather:
    """Per-sample rows (first dimension: samples) that evaluation collects over the whole split.

    For metrics that are not a mean over samples (F1, AUC, a confusion matrix): metrics.py's
    `dataset_metrics` receives every sample's row exactly once, from all ranks, in dataset order.
    """

    rows: torch.Tensor


def evaluation(loss: Mean, metrics: dict[str, Mean | Gather]) -> dict[str, Mean | Gather]:
    """The loss and the metrics of an evaluation batch in one dict; a metric may not be named `loss`."""
    if "loss" in metrics:
        raise StepError("metrics.py returns a metric named 'loss', which would replace the loss; rename the metric")
    return {"loss": loss, **metrics}


def gather_with_grad(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """`tensor`'s rows from every rank, in rank order, with gradients passed back; and where this rank's start.

    For objectives that couple the samples of the global batch (CLIP, SimCLR): each rank's loss
    then sees every rank's embeddings as negatives, and the gradient of each embedding flows back
    to the rank that computed it, so N ranks train exactly like one. Ranks may hold different
    numbers of rows (the short last batch). Every rank must call it. With accumulation it gathers
    one micro-batch per rank: the negatives are those of the micro-step, not of the whole global
    batch (see docs/semantics.md).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor, 0
    # Collectives move equal shapes: pad every rank's rows to the longest, gather, cut the padding off.
    counts = [torch.zeros(1, dtype=torch.long, device=tensor.device) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, torch.tensor([len(tensor)], device=tensor.device))
    sizes = [int(count) for count in counts]
    padded = torch.cat([tensor, tensor.new_zeros((max(sizes) - len(tensor), *tensor.shape[1:]))])
    parts = all_gather_with_autograd(padded)
    rows = torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])
    return rows, sum(sizes[: dist.get_rank()])


def check_train_value(value: object, stage: str) -> Mean:
    """The loss a training step gave for `stage`: a Mean whose gradient can flow to the weights."""
    if not isinstance(value, Mean):
        raise StepError(f"train_step must return a Mean for {stage!r}, got {_describe(value)}; wrap the loss in Mean()")
    if not value.dtype.is_floating_point:
        raise StepError(
            f"the {stage!r} loss from train_step is {value.dtype}, which has no gradient; return a floating point "
            "loss (a cross-entropy, say), not a count or a comparison"
        )
    if not value.total.requires_grad:
        raise StepError(
            f"the {stage!r} loss from train_step has no gradient (computed under no_grad, detached, or from "
            "tensors of an earlier stage); compute it from the model's outputs inside its stage"
        )
    return value


def check_eval_values(values: object) -> dict[str, Mean | Gather]:
    """What eval_step returned: a dict of Mean and Gather values with names usable in the logs."""
    if not isinstance(values, dict) or not values:
        raise StepError(f"eval_step must return a dict of Mean or Gather values, got {_describe(values)}")
    for name, value in values.items():
        if name == "samples" or not isinstance(name, str):
            raise StepError(f"eval_step returned a value named {name!r}; the logs use that name, choose another")
        if not isinstance(value, Mean | Gather):
            raise StepError(
                f"eval_step (step.py, metrics.py) returned {name!r} as {_describe(value)}; return a Mean or a Gather"
            )
        if isinstance(value, Gather) and (not isinstance(value.rows, torch.Tensor) or value.rows.dim() == 0):
            raise StepError(f"eval_step's {name!r}: Gather needs per-sample rows, got {_describe(value.rows)}")
    return values


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, Iterator):
        return "a generator (yield losses only when optim.py returns several optimizers)"
    return "None" if value is None else f"a {type(value).__name__}"
