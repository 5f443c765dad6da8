"""Evaluation: every sample of a split counted exactly once over all replicas. Managed by the looptpl template.

Each replica evaluates its own batches (sampling.py). A `Mean` from step.py adds its weighted
total and its weight; summed over the replicas and batches, total / weight is the split's mean.
A `Gather` collects per-sample rows from every replica, back in dataset order (each batch comes
with its samples' indices), for metrics.py's `dataset_metrics`.
"""

import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from .collect import Mean, check_eval_values
from .config import TrainConfig
from .ema import WeightAverage
from .errors import DataError, StepError, TrainingError, user_code_error
from .logs import ProgressBar
from .sampling import EvalSplit
from .stages import Stage

SUM = tf.distribute.ReduceOp.SUM
RESERVED = ("samples", "epoch", "step", "lr")
# An evaluation step's results: each Mean's [total, weight], each Gather's (indices, rows), the samples counted.
StepResults = tuple[dict[str, tf.Tensor], dict[str, tuple[tf.Tensor, tf.Tensor]], tf.Tensor]


class Evaluator:
    """Evaluates the validation and test splits with step.py's `eval_step`."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        models: keras.Model | dict[str, keras.Model],
        config: TrainConfig,
        splits: dict[str, EvalSplit],
        stages: list[Stage],
        user: tuple[Callable[..., Any], Callable[..., Any]],
        progress: ProgressBar,
    ) -> None:
        self.strategy = strategy
        self.progress = progress  # on a terminal, the batches evaluated so far
        self.seconds = 0.0  # spent evaluating, which the training speed leaves out
        self.models = models
        self.config = config
        self.eval_step, self.dataset_metrics = user  # step.py's and metrics.py's
        self.splits = splits  # "val" and "test": batches of (sample indices, batch), one for each replica
        self.iterators: dict[str, Iterator[Any]] = {}  # of the splits that repeat their passes (sampling.py)
        # --ema-decay: the average of the weights that each stage's optimizer keeps, evaluated too.
        pairs = [(stage.optimizer, stage.variables) for stage in stages]
        self.ema = WeightAverage(pairs) if config.ema_decay else None
        self.units: dict[str, str] = {}  # the `per` of each Mean, learnt while tracing
        # Traced once per split, like the train step (train.py's TrainStep).
        self.steps = {
            split: tf.function(self._step, input_signature=[eval_split.batches.element_spec])
            for split, eval_split in splits.items()
        }

    # Traced as plain Python, as train.py's update is (step.py's eval_step too): AutoGraph cost ~0.5 s a start.
    @tf.autograph.experimental.do_not_convert
    def _step(self, element: Any) -> StepResults:
        """Evaluate one batch on each replica: each Mean's summed [total, weight], each Gather's (indices, rows),
        and the samples counted."""
        sums, gathered, samples = self.strategy.run(self._replica_step, args=(element,))
        sums = {name: self.strategy.reduce(SUM, value, axis=None) for name, value in sums.items()}
        # The rows were gathered from every replica inside the step: any replica's copy holds them all.
        gathered = {name: self.strategy.experimental_local_results(value)[0] for name, value in gathered.items()}
        return sums, gathered, self.strategy.reduce(SUM, samples, axis=None)

    def _replica_step(self, element: Any) -> StepResults:
        indices, batch = element
        try:
            values = check_eval_values(self.eval_step(self.models, batch, self.config))
        except Exception as error:
            raise user_code_error(error, "in eval_step") from None
        sums, gathered = {}, {}
        counted = indices[0] >= 0  # False on a replica given only repeats of a short last batch (sampling.py)
        for name, value in values.items():
            if isinstance(value, Mean):
                self.units.setdefault(value.per, name)
                total_and_weight = tf.cast(tf.stack([value.total, value.weight]), tf.float64)
                sums[name] = tf.where(counted, total_and_weight, tf.zeros_like(total_and_weight))
            else:
                gathered[name] = _gather((indices, value.rows))
        return sums, gathered, tf.reduce_sum(tf.cast(indices >= 0, tf.int64))

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
        """The means and dataset metrics of `split` ("val" or "test"), named `<split>_<name>`."""
        sums: dict[str, np.ndarray] = {}
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        size = 0
        for element in self.progress.counting("validating" if split == "val" else "testing", self._one_pass(split)):
            batch_sums, batch_gathered, samples = self.steps[split](element)
            size += int(samples)
            for name, value in batch_sums.items():
                sums[name] = sums.get(name, 0.0) + value.numpy()
            for name, (indices, rows) in batch_gathered.items():
                parts.setdefault(name, []).append((indices.numpy(), rows.numpy()))
        means = {name: total / weight if weight else math.nan for name, (total, weight) in sums.items()}
        if size == 0:
            raise DataError(f"data.py: the {split} dataset is empty")
        expected = self.splits[split].samples  # known for a split that repeats its passes
        if expected is not None and size != expected:
            raise DataError(
                f"data.py: make_batches gave {size} of the {split} set's {expected} samples; keep every sample, once"
            )
        gathered = {name: _in_dataset_order(name, pieces) for name, pieces in parts.items()}
        try:
            extra = self.dataset_metrics(means, gathered)
        except Exception as error:
            raise user_code_error(error, f"in dataset_metrics on the {split} split") from None
        clash = [name for name in extra if name in means or name in RESERVED] if isinstance(extra, dict) else None
        if clash or not isinstance(extra, dict):
            raise StepError(f"metrics.py: dataset_metrics must return a dict of new names, got {clash or extra!r}")
        results = {f"{split}_{name}": float(value) for name, value in {**means, **extra}.items()}
        for per, name in self.units.items():
            if per != "sample":  # the weight of a per-token Mean: the split's real tokens
                results[f"{split}_{per}s"] = int(sums[name][1])
        results[f"{split}_samples"] = size
        return results

    def _one_pass(self, split: str) -> Iterable[Any]:
        """The split's global batches, once each: the next pass of its iterator, or a new one to its end."""
        eval_split = self.splits[split]
        if eval_split.per_pass is None:
            return eval_split.batches
        if split not in self.iterators:
            self.iterators[split] = iter(eval_split.batches)
        return itertools.islice(self.iterators[split], eval_split.per_pass)


def _gather(value: Any) -> Any:
    """`value`'s rows from every replica (all_gather keeps each replica's number of rows)."""
    context = tf.distribute.get_replica_context()
    return value if context.num_replicas_in_sync == 1 else context.all_gather(value, axis=0)


def _in_dataset_order(name: str, pieces: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """A Gather's rows from every batch, sorted back into dataset order by their samples' indices."""
    indices = np.concatenate([index for index, _ in pieces])
    rows = np.concatenate([row for _, row in pieces])
    if len(rows) != len(indices):
        raise StepError(
            f"eval_step's Gather {name!r} gave {len(rows)} rows for {len(indices)} samples; give one row per sample"
        )
    counted = indices >= 0  # repeats of a short last batch, given to replicas it had no sample for, are -1
    indices, rows = indices[counted], rows[counted]
    return rows[np.argsort(indices, kind="stable")]


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
