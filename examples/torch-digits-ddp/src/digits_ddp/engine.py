"""The training loop: train and validate every epoch, checkpoint, then test.

Managed by the looptpl template: put your own code in model.py, data.py, loss.py, metrics.py
and optim.py.
"""

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from . import distributed
from .callbacks import EarlyStopping, MetricLogger, NonFiniteGuard, ProgressBar
from .checkpoint import Checkpointer
from .config import TrainConfig, check_resumable
from .distributed import Runtime
from .errors import TrainingError
from .loss import per_sample_loss
from .metrics import per_sample_metrics
from .optim import build_optimizer, build_scheduler
from .preflight import check_first_batch, check_per_sample
from .sampling import build_loaders

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Trainer:
    """Owns the model, the optimizer and the data loaders of one run, on one rank."""

    def __init__(
        self, config: TrainConfig, runtime: Runtime, model: nn.Module, datasets: tuple[Dataset, Dataset, Dataset]
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.run_dir = Path(config.run_dir)
        config.check_batch_split(runtime.world_size)
        self.loaders = build_loaders(datasets, config, runtime.rank, runtime.world_size, runtime.device.type == "cuda")
        self.train_sampler = self.loaders.train_sampler

        self.model = distributed.wrap_model(model, runtime)
        # Compile after wrapping: DDP and FSDP hooks must be in place before tracing.
        self.forward = torch.compile(self.model) if config.compile else self.model
        self.optimizer = build_optimizer(self.model, config)
        total_updates = self.train_sampler.updates_per_epoch * config.epochs
        self.scheduler = build_scheduler(self.optimizer, config, total_updates)
        self.autocast_dtype = AUTOCAST_DTYPES.get(config.precision)
        # fp16 gradients can underflow: the scaler multiplies the loss up and skips updates with inf/NaN.
        self.scaler = torch.amp.GradScaler(runtime.device.type, enabled=config.precision == "fp16")

        self.step = 0  # optimizer updates applied so far
        self.epoch = 0  # epochs completed so far
        self.early_stopping = EarlyStopping(config.monitor_mode, config.early_stop_patience)
        self.nan_guard = NonFiniteGuard(config.nan_policy, config.max_consecutive_skips, runtime.is_main)
        self.checkpointer = Checkpointer(self.run_dir, runtime, config.keep_checkpoints)
        self.logger = MetricLogger(self.run_dir) if runtime.is_main else None
        self.progress = ProgressBar(config.progress and runtime.is_main)
        check_first_batch(self.model, datasets[0], runtime.device, self.autocast)
        self.checkpointer.check_free_space(self.model)

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.runtime.device.type, dtype=self.autocast_dtype)

    def _to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = batch
        return (
            inputs.to(self.runtime.device, non_blocking=True),
            targets.to(self.runtime.device, non_blocking=True),
        )

    def train_epoch(self, epoch: int) -> dict[str, float]:
        """One pass over the training set; returns the mean training loss over its samples."""
        self.model.train()
        self.train_sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        batches = iter(self.loaders.train)
        global_batch_sizes = self.train_sampler.global_batch_sizes()
        self.progress.start(epoch + 1, self.config.epochs, len(global_batch_sizes))
        epoch_loss = torch.zeros((), dtype=torch.float64, device=self.runtime.device)
        window_loss = torch.zeros((), dtype=torch.float64, device=self.runtime.device)
        epoch_samples = window_samples = skipped_samples = 0
        self.nan_guard.skipped_this_epoch = 0
        for update, global_batch_size in enumerate(global_batch_sizes):
            update_loss = torch.zeros((), dtype=torch.float64, device=self.runtime.device)
            update_samples = 0
            for micro_step in range(self.config.grad_accum_steps):
                inputs, targets = self._to_device(next(batches))
                # Gradients are synchronized only on the last micro-step of an update.
                is_last = micro_step == self.config.grad_accum_steps - 1
                with distributed.gradient_sync(self.model, enabled=is_last):
                    with self.autocast():
                        outputs = self.forward(inputs)
                        losses = check_per_sample(per_sample_loss(outputs, targets), len(targets), "loss.py")
                    # The update must follow the mean loss over the B samples of the global batch:
                    # (1/B) * sum_i grad(l_i) over every rank and micro-step. Gradient sync *averages*
                    # over the W ranks, so each rank adds W/B * sum(l_i) over its own samples; the
                    # average of the W ranks is then exactly the mean over all B. B counts the samples
                    # actually in this global batch, so a short last batch is averaged over its true size.
                    scaled_loss = losses.sum() * (self.runtime.world_size / global_batch_size)
                    self.scaler.scale(scaled_loss).backward()
                update_loss += losses.detach().sum(dtype=torch.float64)
                update_samples += len(targets)
            if self._optimizer_step(epoch):
                epoch_loss += update_loss
                window_loss += update_loss
                epoch_samples += update_samples
                window_samples += update_samples
            else:  # --nan-policy skip dropped this update: its samples count as not trained on
                skipped_samples += global_batch_size
            if (update + 1) % self.config.log_every == 0 or update + 1 == len(global_batch_sizes):
                # One small all-reduce every --log-every updates: the global running loss, checked for
                # NaN/inf on every rank alike so all ranks stop together.
                loss = self._global_mean(window_loss, window_samples)
                self._check_finite(loss, epoch)
                self.progress.update(update + 1, epoch_samples * self.runtime.world_size, loss)
                window_loss.zero_()
                window_samples = 0
        self.progress.finish()
        expected = self.train_sampler.samples_per_epoch - skipped_samples
        totals = distributed.all_reduce_sum(
            torch.stack([epoch_loss, torch.tensor(float(epoch_samples), dtype=torch.float64, device=epoch_loss.device)])
        )
        if round(totals[1].item()) != expected:
            raise TrainingError(f"ranks trained on {totals[1].item():.0f} samples this epoch, expected {expected}")
        result = {"train_loss": totals[0].item() / max(1, expected)}
        if self.nan_guard.skips_updates:
            result["skipped_updates"] = self.nan_guard.skipped_this_epoch
        return result

    def _optimizer_step(self, epoch: int) -> bool:
        """Clip, step and schedule once the global batch's gradients are complete; False if skipped."""
        self.scaler.unscale_(self.optimizer)  # clip the true gradients, not fp16-scaled ones
        if self.config.max_grad_norm > 0 or self.nan_guard.skips_updates:
            # The norm of the whole, synchronized gradient: the same value on every rank.
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm or math.inf)
            # Reading the norm waits for the GPU, so only --nan-policy skip looks at it every update.
            if self.nan_guard.skips_updates and not self.nan_guard.allow_update(
                distributed.is_finite(norm), epoch, self.step
            ):
                self.optimizer.zero_grad(set_to_none=True)
                return False
        scale_before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # With fp16 an update with inf/NaN gradients is skipped and the scale lowered; the schedule
        # only advances on updates that happened.
        if not (self.scaler.is_enabled() and self.scaler.get_scale() < scale_before):
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return True

    def _global_mean(self, loss_sum: torch.Tensor, samples: int) -> float:
        count = torch.tensor(float(samples), dtype=torch.float64, device=loss_sum.device)
        totals = distributed.all_reduce_sum(torch.stack([loss_sum, count]))
        return totals[0].item() / max(1.0, totals[1].item())

    def _check_finite(self, loss: float, epoch: int) -> None:
        if not math.isfinite(loss):
            raise TrainingError(
                f"training loss is {loss} at epoch {epoch + 1}, step {self.step}; lower --lr, check your data "
                "for NaN/inf, or use --precision fp32"
            )

    @torch.no_grad()
    def evaluate(self, split: str) -> dict[str, float]:
        """Mean loss and metrics over every sample of `split` ("val" or "test"), each counted once."""
        loader = self.loaders.val if split == "val" else self.loaders.test
        real_size = loader.sampler.real_size  # type: ignore[attr-defined]
        self.model.eval()
        sums: dict[str, torch.Tensor] = {}
        seen = 0
        for batch in loader:
            inputs, targets = self._to_device(batch)
            with self.autocast():
                outputs = self.forward(inputs)
                values = {"loss": per_sample_loss(outputs, targets), **per_sample_metrics(outputs, targets)}
            # Samples past this rank's real_size are padding (sampling.py): mask them out so that
            # every sample of the split is counted exactly once over all ranks.
            keep = max(0, min(len(targets), real_size - seen))
            seen += len(targets)
            for name, value in values.items():
                value = check_per_sample(value, len(targets), "metrics.py" if name != "loss" else "loss.py")
                sums[name] = sums.get(name, 0) + value[:keep].sum(dtype=torch.float64)
        names = list(sums)
        count = torch.tensor(float(real_size), dtype=torch.float64, device=self.runtime.device)
        totals = distributed.all_reduce_sum(torch.stack([*(sums[name] for name in names), count])).tolist()
        samples = totals.pop()
        results = {f"{split}_{name}": total / samples for name, total in zip(names, totals, strict=True)}
        results[f"{split}_samples"] = int(samples)
        return results

    def state_dict(self) -> dict[str, Any]:
        """Everything besides weights and optimizer that a resumed run needs."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "early_stopping": self.early_stopping.state_dict(),
            "config": dataclasses.asdict(self.config),
        }

    def resume(self) -> None:
        """Continue from the latest checkpoint in the run directory."""
        path, checkpoint = self.checkpointer.load_latest()
        check_resumable(self.config, checkpoint["config"])
        self.checkpointer.restore(path, checkpoint, self.model, self.optimizer)
        self.epoch, self.step = checkpoint["epoch"], checkpoint["step"]
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.scaler.load_state_dict(checkpoint["scaler"])
        self.early_stopping.load_state_dict(checkpoint["early_stopping"])
        if self.logger is not None:
            self.logger.keep_until(self.epoch)
            print(f"resumed from epoch {self.epoch}, step {self.step}", flush=True)

    def fit(self) -> dict[str, Any] | None:
        """Train until --epochs or early stopping, then test and return the summary.

        Returns None when --stop-after-epoch ends the run early: it is unfinished, not tested.
        """
        started, samples_trained = time.perf_counter(), 0
        stopped_early = False
        if 0 < self.config.stop_after_epoch <= self.epoch:
            return None  # e.g. torchrun restarted the ranks after that epoch's checkpoint was written
        for epoch in range(self.epoch, self.config.epochs):
            epoch_started = time.perf_counter()
            record: dict[str, Any] = {"epoch": epoch + 1, **self.train_epoch(epoch), **self.evaluate("val")}
            samples_trained += self.train_sampler.samples_per_epoch
            record.update(step=self.step, lr=self.scheduler.get_last_lr()[0])
            record["epoch_time_s"] = round(time.perf_counter() - epoch_started, 3)
            if not (math.isfinite(record["train_loss"]) and math.isfinite(record["val_loss"])):
                raise TrainingError(
                    f"the weights diverged in epoch {epoch + 1} (train_loss {record['train_loss']}, val_loss "
                    f"{record['val_loss']}); no checkpoint was written for it; lower --lr or use --precision fp32"
                )
            if self.config.monitor not in record:
                raise TrainingError(
                    f"--monitor {self.config.monitor} is not a logged metric; choose one of "
                    + ", ".join(name for name in record if name.startswith(("train_", "val_")))
                )
            # Every rank holds the same all-reduced metrics, so every rank computes the same result.
            is_best = self.early_stopping.update(record[self.config.monitor], epoch + 1)
            self.epoch = epoch + 1
            if self.logger is not None:
                self.logger.log(record)
            self.checkpointer.save(self.model, self.optimizer, self.state_dict(), self.epoch, is_best)
            # Rank 0 decides and every rank follows, so all ranks leave the loop at the same epoch.
            if distributed.agree(self.early_stopping.should_stop):
                stopped_early = True
                break
            if self.epoch == self.config.stop_after_epoch:
                return None
        train_seconds = time.perf_counter() - started
        return self.test(stopped_early, samples_trained / max(train_seconds, 1e-9))

    def test(self, stopped_early: bool, samples_per_second: float) -> dict[str, Any]:
        """Evaluate the best (or last) checkpoint on the test set and write summary.json."""
        tested = "last"
        if self.config.test_on == "best" and (self.checkpointer.directory / "best.pt").exists():
            self.checkpointer.load_weights(self.checkpointer.directory / "best.pt", self.model)
            tested = f"best (epoch {self.early_stopping.best_epoch})"
        summary: dict[str, Any] = {
            "epochs_run": self.epoch,
            "steps": self.step,
            "stopped_early": stopped_early,
            "best_epoch": self.early_stopping.best_epoch,
            f"best_{self.config.monitor}": self.early_stopping.best,
            "tested_checkpoint": tested,
            **self.evaluate("test"),
            "train_samples_per_s": round(samples_per_second, 1),
        }
        if self.logger is not None:
            self.logger.close()
        return summary
