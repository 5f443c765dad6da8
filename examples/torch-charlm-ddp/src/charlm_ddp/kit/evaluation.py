"""Evaluation: every sample of a split counted exactly once over all ranks. Managed by the looptpl template.

Each rank evaluates its own shard (sampling.py; streaming.py for a stream). A `Mean` from step.py
adds its weighted total and its weight; one all-reduce sums them over the ranks, and total /
weight is the split's mean. A `Gather` collects per-sample rows from every rank, back in dataset
order, for metrics.py's `dataset_metrics`. Ranks whose shard is a batch shorter run a padding
batch, only so that every rank joins the same collectives: its values are dropped.
"""

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import distributed
from .collect import Gather, Mean, check_eval_values
from .config import TrainConfig
from .ema import WeightAverage
from .errors import StepError, TrainingError, user_code_error
from .loaders import Loaders
from .logs import ProgressBar

RESERVED = ("samples", "epoch", "step", "lr")
# step.py's eval_step, and metrics.py's dataset_metrics: what the loop hands the Evaluator.
EvalStep = Callable[[Any, Any, TrainConfig], object]
DatasetMetrics = Callable[[dict[str, float], dict[str, torch.Tensor]], dict[str, float]]


class Evaluator:
    """Evaluates a split with the trained weights and, with --ema-decay, with their moving average."""

    def __init__(
        self,
        loaders: Loaders,
        models: Any,
        config: TrainConfig,
        autocast: Callable[[], contextlib.AbstractContextManager[None]],
        ema: WeightAverage | None,
        user: tuple[EvalStep, DatasetMetrics],
        progress: ProgressBar,
    ) -> None:
        self.loaders, self.models, self.config = loaders, models, config
        self.user = user  # step.py's eval_step and metrics.py's dataset_metrics
        self.autocast, self.device, self.ema = autocast, loaders.device, ema
        self.progress = progress  # on a terminal, the batches evaluated so far
        self.seconds = 0.0  # spent evaluating, which the training speed leaves out

    def evaluate(self, split: str) -> dict[str, float]:
        """`split`'s loss and metrics, named `<split>_<name>`; the average's as `<split>_ema_<name>`."""
        started = time.perf_counter()
        results = self._evaluate(split)
        if self.ema is not None:
            with self.ema.swapped_in():
                averaged = self._evaluate(split)
            del averaged[f"{split}_samples"]
            results.update({name.replace(split, f"{split}_ema", 1): value for name, value in averaged.items()})
        self.seconds += time.perf_counter() - started
        return results

    def _evaluate(self, split: str) -> dict[str, float]:
        what = "validating" if split == "val" else "testing"
        batches = self.progress.counting(what, self.loaders.evaluation_batches(split))
        return evaluate_split(split, batches, self.models, self.config, self.autocast, self.device, self.user)


@torch.no_grad()
def evaluate_split(
    split: str,
    batches: Iterable[tuple[Any, bool, int]],
    models: Any,
    config: TrainConfig,
    autocast: Callable[[], contextlib.AbstractContextManager[None]],
    device: torch.device,
    user: tuple[EvalStep, DatasetMetrics],
) -> dict[str, float]:
    """The means and dataset metrics of `split` ("val" or "test") from this rank's (batch, padding,
    samples), named `<split>_<name>`."""
    eval_step, dataset_metrics = user
    sums: dict[str, torch.Tensor] = {}
    units: dict[str, str] = {}
    rows: dict[str, list[torch.Tensor]] = {}
    real = 0  # this rank's samples, padding left out
    for batch, padding, samples in batches:
        try:
            with autocast():
                values = check_eval_values(eval_step(models, batch, config))
        except Exception as error:
            raise user_code_error(error, f"in eval_step on the {split} split") from None
        real += samples
        for name, value in values.items():
            if isinstance(value, Mean):
                pair = torch.stack([value.total.detach(), value.weight]).double()
                sums[name] = sums.get(name, 0) + (torch.zeros_like(pair) if padding else pair)
                units.setdefault(value.per, name)
            elif not padding:
                rows.setdefault(name, []).append(value.rows.detach())
    names = list(sums)
    # The samples of every rank are summed with the means' totals: one all-reduce.
    count = torch.tensor([real, 0.0], dtype=torch.float64, device=device)
    stacked = torch.stack([*(sums[name] for name in names), count])
    *totals, (split_size, _) = distributed.all_reduce_sum(stacked).tolist()
    means = {name: total / weight if weight else math.nan for name, (total, weight) in zip(names, totals, strict=True)}
    gathered = {name: _in_dataset_order(name, rows, real) for name in _gather_names(values)}
    try:
        extra = dataset_metrics(means, gathered)
    except Exception as error:
        raise user_code_error(error, f"in dataset_metrics on the {split} split") from None
    clash = [name for name in extra if name in means or name in RESERVED]
    if clash or not isinstance(extra, dict):
        raise StepError(f"metrics.py: dataset_metrics must return a dict of new names, got {clash or extra!r}")
    results = {f"{split}_{name}": value for name, value in {**means, **extra}.items()}
    for per, name in units.items():
        if per != "sample":  # the weight of a per-token Mean: the split's real tokens
            results[f"{split}_{per}s"] = int(totals[names.index(name)][1])
    results[f"{split}_samples"] = int(split_size)
    return results


def _gather_names(values: dict[str, Mean | Gather]) -> list[str]:
    """Names of the Gather values; every rank's last batch has the same names (padding or not)."""
    return [name for name, value in values.items() if isinstance(value, Gather)]


def _in_dataset_order(name: str, rows: dict[str, list[torch.Tensor]], real: int) -> torch.Tensor:
    """The rows of every rank, back in dataset order: rank r holds samples r, r + N, r + 2N, ..."""
    local = torch.cat(rows[name]) if name in rows else torch.empty(0)
    if len(local) != real:
        raise StepError(
            f"eval_step's Gather {name!r} gave {len(local)} rows for {real} samples; give one row per sample"
        )
    parts = _all_gather_rows(local)
    ordered = torch.empty((sum(len(part) for part in parts), *local.shape[1:]), dtype=local.dtype)
    for rank, part in enumerate(parts):
        ordered[rank :: len(parts)] = part
    return ordered


def _all_gather_rows(rows: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's rows (any number per rank, the same trailing shape), in rank order, on the CPU.

    Collectives move equal shapes, so each rank pads to the longest and the padding is cut off.
    """
    sizes = [int(size) for size in distributed.all_gather(torch.tensor([len(rows)]))]
    padded = torch.zeros((max(sizes), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    padded[: len(rows)] = rows
    return [part[:size].cpu() for part, size in zip(distributed.all_gather(padded), sizes, strict=True)]


def finite_or_raise(record: dict[str, Any], where: str) -> None:
    """Stop on a NaN/inf value, naming it and what to check."""
    bad = [name for name, value in record.items() if isinstance(value, float) and not math.isfinite(value)]
    if not bad:
        return
    name = bad[0]
    if name.startswith("train_"):
        advice = "the weights diverged; lower --lr, check the training data for NaN/inf, or use --precision fp32"
    else:
        split = name.split("_")[0]
        advice = f"the training loss is finite: check the {split} data in data.py for NaN/inf and metrics.py"
    raise TrainingError(f"{name} is {record[name]} at {where}; {advice}")
