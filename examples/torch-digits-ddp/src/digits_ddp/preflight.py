"""Checks run once before training. Managed by the looptpl template.

They try your model, loss and metrics on two samples from data.py, so a wrong shape or dtype
fails at once with a message naming the file to fix, not deep inside the first epoch.
"""

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from .errors import DataError
from .loss import per_sample_loss
from .metrics import per_sample_metrics


def check_first_batch(
    model: nn.Module,
    dataset: Dataset,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager[None]],
) -> None:
    """Run model.py, loss.py and metrics.py on a tiny batch.

    Every rank must call this: with FSDP each forward is a collective.
    """
    items = [dataset[index] for index in range(min(2, len(dataset)))]  # type: ignore[arg-type]
    try:
        inputs, targets = default_collate(items)
    except (TypeError, ValueError, RuntimeError) as error:
        raise DataError(f"data.py: each item must be an (inputs, targets) pair of tensors ({error})") from None
    inputs, targets = inputs.to(device), targets.to(device)
    batch = f"inputs {_describe(inputs)}, targets {_describe(targets)}"
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast():
            outputs = _attempt("model.py", batch, lambda: model(inputs))
            batch += f", outputs {_describe(outputs)}"
            losses = _attempt("loss.py", batch, lambda: per_sample_loss(outputs, targets))
            check_per_sample(losses, len(targets), "loss.py")
            metrics = _attempt("metrics.py", batch, lambda: per_sample_metrics(outputs, targets))
            for value in metrics.values():
                check_per_sample(value, len(targets), "metrics.py")
    finally:
        model.train(was_training)


def check_per_sample(values: torch.Tensor, batch_size: int, source: str) -> torch.Tensor:
    """A loss or metric must give one value per sample: an averaged value would silently mis-scale."""
    if values.shape != (batch_size,):
        raise DataError(
            f"{source} must return one value per sample, shape [{batch_size}], got {list(values.shape)}; "
            "do not average over the batch"
        )
    return values


def _attempt(source: str, batch: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as error:
        raise DataError(f"{source} failed on a batch from data.py ({batch}): {error}") from None


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__
