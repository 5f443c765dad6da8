"""The training loop: train and validate every epoch, checkpoint, then test.

Managed by the looptpl template: put your own code in step.py, model.py, data.py, loss.py,
metrics.py, optim.py and settings.py.
"""

import math
import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from .callbacks import EarlyStopping, MetricLogger, ProgressBar
from .checkpoint import Checkpointer, ConfigState
from .config import TrainConfig, check_resumable
from .distributed import Runtime
from .errors import TrainingError
from .evaluation import Evaluator, finite_or_raise
from .model import build_model
from .optim import build_optimizer, build_schedule
from .sampling import distribute_eval, distribute_train, split_size
from .stages import Stage, build_stages, split_models
from .train_step import TrainStep

PRECISION_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


class Trainer:
    """Owns the models, the optimizers and the distributed datasets of one run."""

    def __init__(
        self, config: TrainConfig, runtime: Runtime, datasets: tuple[tf.data.Dataset, tf.data.Dataset, tf.data.Dataset]
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.strategy = runtime.strategy
        self.run_dir = Path(config.run_dir)
        self.train_set, val_set, test_set = datasets
        self.train_size = split_size(self.train_set, "train")
        eval_sets = {
            "val": distribute_eval(self.strategy, val_set, "val", config.eval_batch_size),
            "test": distribute_eval(self.strategy, test_set, "test", config.eval_batch_size),
        }

        # Layers built from here on compute in bf16/fp16 (under those --precision values) and keep
        # float32 weights.
        keras.mixed_precision.set_dtype_policy(PRECISION_POLICIES[config.precision])
        # Everything that holds variables is created under the strategy's scope, which places each
        # variable (one copy per replica, kept in sync) and ties it to the strategy.
        with self.strategy.scope():
            self.models = build_model(config)
            # Models without trainable weights (a distillation teacher) are only run: no optimizer,
            # not in the checkpoints (model.py loads their weights).
            trained, _ = split_models(self.models)
            self.updates_per_epoch, self.samples_per_epoch = self.epoch_size()
            schedule = build_schedule(config, self.updates_per_epoch * config.epochs)
            # One stage per optimizer, each updating the model of the same name (stages.py).
            self.stages = build_stages(build_optimizer(config, schedule), trained, config.precision == "fp16")
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)  # epochs completed
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False)  # updates applied
            self.train_step = TrainStep(config, runtime, self.models, self.stages, (self.epoch, self.step))
            self.early_stopping = EarlyStopping(config.monitor_mode, config.early_stop_patience)
            self.saved_config = ConfigState(config)
            # The trained models and their optimizers, by name with several (the checkpoint's keys).
            one = len(self.stages) == 1
            self.trained = self.stages[0].model if one else {stage.name: stage.model for stage in self.stages}
            optimizers = self.stages[0].optimizer if one else {stage.name: stage.optimizer for stage in self.stages}
            self.checkpointer = Checkpointer(
                self.run_dir,
                config.keep_checkpoints,
                model=self.trained,
                optimizer=optimizers,
                epoch=self.epoch,
                step=self.step,
                early_stopping=self.early_stopping,
                config=self.saved_config,
            )
        self.logger = MetricLogger(self.run_dir) if runtime.is_chief else None
        self.progress = ProgressBar(config.progress and runtime.is_chief)
        sizes = {"val": split_size(val_set, "val"), "test": split_size(test_set, "test")}
        self.evaluator = Evaluator(self.strategy, self.models, config, eval_sets, sizes)

    def epoch_size(self) -> tuple[int, int]:
        """Updates and samples trained per epoch: a short last batch is kept if every micro-batch gets a sample."""
        full, rest = divmod(self.train_size, self.config.global_batch_size)
        if rest < self.strategy.num_replicas_in_sync * self.config.grad_accum_steps:
            return full, full * self.config.global_batch_size
        return full + 1, self.train_size

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One pass over the training set; returns the mean training loss of each stage (and the skipped updates)."""
        self.progress.start(epoch + 1, self.config.epochs, self.updates_per_epoch)
        # Summed over the epoch and since the last check, one row per stage: loss total and weight
        # of applied updates, all weight, skipped updates (train_step.py).
        epoch_totals = window = tf.zeros([len(self.stages), 4], tf.float64)
        samples = 0
        dataset = distribute_train(self.strategy, self.train_set, self.config, epoch, self.samples_per_epoch)
        batches = iter(dataset)
        updates, log_every = 0, self.config.log_every
        while updates < self.updates_per_epoch:
            count = min(self.config.steps_per_call, self.updates_per_epoch - updates)
            try:
                totals, call_samples = self.train_step.call(batches, tf.constant(count))
            except tf.errors.OutOfRangeError:
                raise TrainingError(
                    f"the train set ran out after {updates} of {self.updates_per_epoch} updates this epoch; "
                    "data.py must give the same samples every epoch"
                ) from None
            epoch_totals, window = epoch_totals + totals, window + totals
            samples += int(call_samples)
            updates += count
            # Progress and the NaN check at the end of each call that passes a multiple of --log-every.
            if updates // log_every > (updates - count) // log_every or updates == self.updates_per_epoch:
                stage = self.train_step.gave_up()
                if stage is not None:
                    raise TrainingError(self._not_finite_message(epoch, stage))
                total, kept, _, _ = window[0].numpy()
                self.progress.update(updates, samples, total / max(1e-12, kept))
                window = tf.zeros_like(window)
        self.progress.finish()
        if samples != self.samples_per_epoch:
            raise TrainingError(
                f"trained on {samples} samples this epoch, expected {self.samples_per_epoch}; data.py's make_batches "
                "must keep every sample"
            )
        result: dict[str, float] = {}
        for stage, (total, kept, _, _) in zip(self.stages, epoch_totals.numpy(), strict=True):
            result[self._loss_name(stage)] = total / kept if kept else math.nan
        if self.config.nan_policy == "skip":
            result["skipped_updates"] = int(epoch_totals[:, 3].numpy().max())
        return result

    def _loss_name(self, stage: Stage) -> str:
        return "train_loss" if len(self.stages) == 1 else f"train_{stage.name}_loss"

    def _not_finite_message(self, epoch: int, stage: Stage) -> str:
        """Why the run stops: the NaN/inf update that --nan-policy stop refuses, or too many skipped in a row."""
        where, advice = f"epoch {epoch + 1}, step {int(self.step.numpy())}", "lower --lr, check your data for NaN/inf"
        which = "" if len(self.stages) == 1 else f"the {stage.name} "
        if self.config.nan_policy == "skip":
            skips = self.config.max_consecutive_skips + 1
            return (
                f"{which or 'the '}loss or gradients were NaN/inf for {skips} updates in a row ({where}); the weights "
                f"have diverged: {advice}, or use --precision fp32"
            )
        loss = float(stage.skipped_loss.numpy())
        problem = f"{which}training loss is {loss}"
        if math.isfinite(loss):  # the loss was fine, its gradients were not
            problem = f"the {which}gradients are NaN/inf (training loss {loss:.4g})"
        return f"{problem} at {where}; {advice}, or use --precision fp32"

    def evaluate(self, split: str) -> dict[str, float]:
        """The loss and metrics over every sample of `split` ("val" or "test"), each counted once."""
        return self.evaluator.evaluate(split)

    def resume(self) -> None:
        """Continue from the latest checkpoint in the run directory."""
        self.checkpointer.restore_latest()
        check_resumable(self.config, self.saved_config.saved)
        if self.logger is not None:
            self.logger.keep_until(int(self.epoch.numpy()))
            print(f"resumed from epoch {int(self.epoch.numpy())}, step {int(self.step.numpy())}", flush=True)

    def fit(self) -> dict[str, Any] | None:
        """Train until --epochs or early stopping, then test and return the summary.

        Returns None when --stop-after-epoch ends the run early: it is unfinished, not tested.
        """
        started, samples_trained = time.perf_counter(), 0
        stopped_early = False
        for epoch in range(int(self.epoch.numpy()), self.config.epochs):
            epoch_started = time.perf_counter()
            record: dict[str, Any] = {"epoch": epoch + 1, **self.train_epoch(epoch), **self.evaluate("val")}
            samples_trained += self.samples_per_epoch
            record.update(step=int(self.step.numpy()), lr=float(self.stages[0].optimizer.learning_rate))
            record["epoch_time_s"] = round(time.perf_counter() - epoch_started, 3)
            if self.config.monitor not in record:
                raise TrainingError(
                    f"--monitor {self.config.monitor} is not a logged metric; choose one of "
                    + ", ".join(name for name in record if name.startswith(("train_", "val_")))
                )
            finite_or_raise(record, f"epoch {epoch + 1}")  # never checkpoint NaN weights or pick them as the best
            is_best = self.early_stopping.update(record[self.config.monitor], epoch + 1)
            self.epoch.assign(epoch + 1)
            if self.logger is not None:
                self.logger.log(record)
            self.checkpointer.save(epoch + 1, is_best)
            if self.runtime.agree(self.early_stopping.should_stop):
                stopped_early = True
                break
            if epoch + 1 == self.config.stop_after_epoch:
                return None
        train_seconds = time.perf_counter() - started
        return self.test(stopped_early, samples_trained / max(train_seconds, 1e-9))

    def test(self, stopped_early: bool, samples_per_second: float) -> dict[str, Any]:
        """Evaluate the best (or last) weights on the test set and return the summary."""
        tested = "last"
        if self.config.test_on == "best":
            tested = self.checkpointer.restore_best_weights(self.trained)
            if tested == "best":
                tested = f"best (epoch {int(self.early_stopping.best_epoch.numpy())})"
        summary: dict[str, Any] = {
            "epochs_run": int(self.epoch.numpy()),
            "steps": int(self.step.numpy()),
            "stopped_early": stopped_early,
            "best_epoch": int(self.early_stopping.best_epoch.numpy()),
            f"best_{self.config.monitor}": self.early_stopping.best_value(),
            "tested_checkpoint": tested,
            **self.evaluate("test"),
            "train_samples_per_s": round(samples_per_second, 1),
        }
        if self.logger is not None:
            self.logger.close()
        return summary
