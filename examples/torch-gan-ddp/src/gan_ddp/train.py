"""Train gan_ddp: the whole loop on one page. Managed by the looptpl template.

Launch:
    python -m gan_ddp.train                                            # one process: CPU or one GPU
    torchrun --standalone --nproc-per-node 8 -m gan_ddp.train           # 8 GPUs on one machine
    torchrun --standalone --nproc-per-node 2 -m gan_ddp.train --device cpu  # 2 CPU ranks (gloo)
    # N machines: run on every node; HOST is the first node's address, JOB any shared id
    torchrun --nnodes N --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        --rdzv-id JOB --max-restarts 3 -m gan_ddp.train

Read it top to bottom: `main` sets up the processes, `run` builds the model and data, `Trainer`
builds the run (wrap, compile, optimizers, schedules), `fit` runs the epochs, `train_epoch` the
updates, `update` one update, and `update_stage` one optimizer's update: micro-steps, the exact
loss scaling, backward, gradient sync, clipping, the step (a GAN's update runs it per optimizer).
distributed.py holds the strategy (DDP); your files are data.py, model.py, step.py, loss.py,
metrics.py, optim.py, hooks.py and settings.py. kit/ holds the machinery the loop calls in one line
(checkpoints, data order, logs, config, messages): you never need to open it to follow a run.
`--help` lists every flag, yours first.
"""

import dataclasses
import functools
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence, Sized
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from .kit.contract import message
from .kit.errors import (
    ConfigError,
    RunError,
    explain_failure,
    import_failure,
    in_your_code,
    report,
    several_models_hint,
    three_datasets,
)

# Before your files are imported: each function or class the loop calls that they lack, or that takes other
# arguments than the loop passes, in one line (an update of the template may have changed what it calls).
if mismatches := message(Path(__file__).parent):
    report(mismatches)
    sys.exit(1)

try:  # your files are imported here (settings.py by kit/config.py): a mistake in one is one line, not a traceback
    from . import data, distributed
    from . import model as model_file
    from .data import build_datasets
    from .distributed import Runtime
    from .hooks import Hooks
    from .kit.callbacks import EarlyStopping, HookCaller, Run
    from .kit.checkpoint import Checkpointer
    from .kit.collect import Mean, check_train_value
    from .kit.config import TrainConfig, check_resumable, parse_config
    from .kit.ema import WeightAverage
    from .kit.evaluation import Evaluator, finite_or_raise
    from .kit.loaders import Loaders
    from .kit.logs import MetricLogger, ProgressBar
    from .kit.models import checkpoint_activations, compile_model, make_autocast, split_models
    from .kit.profiling import UpdateProfiler
    from .kit.rundir import prepare_data, prepare_run_dir
    from .kit.runs import closing_lines, opening_line
    from .kit.stages import (
        Stage,
        build_stages,
        check_all_used,
        check_finite,
        grad_norms,
        load_stages_state,
        loss_totals,
        mean_losses,
        micro_step_losses,
        next_loss,
        only_training,
        stages_state,
    )
    from .kit.throughput import Throughput
    from .metrics import dataset_metrics
    from .model import build_model
    from .optim import build_optimizer, build_scheduler
    from .step import eval_step, train_step
except Exception as error:
    if (problem := import_failure(error)) is None:
        raise
    report(f"error: {problem}")
    sys.exit(1)

# The signals that stop a run, as people name them.
SIGNALS: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    try:
        exit_code = run(config, distributed.setup(config))
    except RunError as error:
        report(f"error: {error}", every_rank=error.on_every_rank)
        # An error raised alike on every rank lets all of them leave together; one raised on this rank
        # alone (a bad batch) must not wait for the others, which would hang in their next collective.
        distributed.teardown(wait_for_others=error.on_every_rank)
        return error.exit_code
    except KeyboardInterrupt:  # Ctrl-C before training started, a second one during it, or one while testing
        report("error: stopped by Ctrl-C; a run that wrote a checkpoint continues with --resume")
        distributed.teardown(wait_for_others=False)
        return 130
    except BaseException as error:
        # A crash: leave at once so the other ranks fail fast instead of waiting for this one.
        distributed.teardown(wait_for_others=False)
        reason = explain_failure(error)
        if reason is not None:
            report(f"error: {reason}", every_rank=False)
            return 1
        raise
    distributed.teardown(wait_for_others=True)
    return exit_code


def run(config: TrainConfig, runtime: distributed.Runtime) -> int:
    """Train, test and write the summary; returns the exit status."""
    started = time.monotonic()
    config, resume = prepare_run_dir(config, runtime)
    prepare_data(getattr(data, "prepare_data", None), config, runtime)
    # The same seed on every rank: identical data and identical initial weights everywhere.
    seed_everything(config.seed)
    with in_your_code("building the model"):
        built = build_model(config)
    with in_your_code("building the datasets"):
        datasets = build_datasets(config)
    train_set, val_set, test_set = three_datasets(datasets)
    trainer = Trainer(config, runtime, built, (train_set, val_set, test_set))
    if runtime.is_main:  # the first line on the screen: where the run trains, and how much
        where = runtime.device.type + (f", {runtime.world_size} ranks" if runtime.world_size > 1 else "")
        weights = sum(weight.numel() for weight in trainer.trained.parameters())
        samples = len(train_set) if isinstance(train_set, Sized) else None
        shape = (trainer.epochs, trainer.updates_per_epoch, config.global_batch_size)
        print(opening_line(Path(config.run_dir), where, weights, samples, shape), flush=True)
    if resume:
        trainer.resume()
    else:
        # From here on each rank draws its own numbers (dropout, augmentation).
        seed_everything(config.seed + runtime.rank)
    summary = trainer.fit()
    trainer.checkpointer.finish()  # the last checkpoint may still be being written (--async-checkpoints)
    if summary is None:
        if runtime.is_main:
            again = f"--resume --run-dir {config.run_dir}"
            print(f"stopped {trainer.stopped}, checkpointed; continue with {again}", flush=True)
        # 128 + the signal (130 for Ctrl-C, 143 for SIGTERM) tells a scheduler the job was stopped, not finished.
        return 128 + trainer.stop_signal if trainer.stop_signal else 0
    if runtime.is_main:
        (Path(config.run_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        took = time.monotonic() - started
        print("\n".join(closing_lines(summary, Path(config.run_dir), took, __package__)), flush=True)
    # The summary is written either way; a NaN test result still fails the run (on every rank alike).
    finite_or_raise(summary, "the final test")
    return 0


class Trainer:
    """Owns the models, the optimizers and the data loaders of one run, on one rank."""

    def __init__(
        self, config: TrainConfig, runtime: Runtime, built: object, datasets: tuple[Dataset, Dataset, Dataset | None]
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.run_dir = Path(config.run_dir)
        config.check_batch_split(runtime.world_size)
        collate = getattr(data, "collate", default_collate)  # data.py's, if it has one
        self.loaders = Loaders(datasets, config, runtime.rank, runtime.world_size, runtime.device, collate)

        trained, frozen = split_models(built)
        if config.activation_checkpointing:  # before DDP wraps it: its hooks run around the blocks
            for model in trained.values():
                checkpoint_activations(model, getattr(model_file, "checkpoint_units", None))
        self.wrapped = {name: distributed.wrap_model(model, runtime) for name, model in trained.items()}
        self.frozen = {name: model.to(runtime.device).eval().requires_grad_(False) for name, model in frozen.items()}
        # Compile after wrapping: DDP's hooks must be in place before tracing.
        compiled = {name: compile_model(model, config) for name, model in self.wrapped.items()}
        # step.py receives what model.py built: one module, or the dict of them.
        self.models: Any = compiled["model"] if not isinstance(built, dict) else {**compiled, **self.frozen}
        # optim.py gets model.py's network(s) unwrapped, with their own methods: the wrapper trains the same weights.
        trained_view: Any = trained["model"] if not isinstance(built, dict) else trained
        with in_your_code("building the optimizer", hint=several_models_hint(trained_view)):
            optimizers = build_optimizer(trained_view, config)
        self.updates_per_epoch = self.loaders.updates_per_epoch
        self.total_updates = config.max_steps or self.updates_per_epoch * config.epochs
        self.epochs = -(-self.total_updates // self.updates_per_epoch)  # with --max-steps the last one may be partial
        with in_your_code("building the schedule"):
            schedulers = build_scheduler(optimizers, config, self.total_updates)
        self.stages = build_stages(optimizers, schedulers, self.wrapped, config, runtime)
        # What the checkpoints hold: the trained weights, without the frozen models.
        self.trained: nn.Module = self.wrapped["model"] if not isinstance(built, dict) else nn.ModuleDict(self.wrapped)
        self.autocast = make_autocast(config.precision, runtime.device)
        self.ema = WeightAverage(self.trained, config.ema_decay) if config.ema_decay else None
        self.profiler = UpdateProfiler(config.profile, Path(config.run_dir), runtime)  # --profile
        self.progress = ProgressBar(config.progress and runtime.is_main)
        user = (eval_step, dataset_metrics)
        self.evaluator = Evaluator(self.loaders, self.models, config, self.autocast, self.ema, user, self.progress)

        self.step = 0  # optimizer updates applied so far
        self.epoch = 0  # epochs completed so far
        self.position = 0  # updates done in the epoch in progress, when a checkpoint was written part-way
        # The epoch's running totals on this rank (loss sums, skipped updates), as checkpoints hold them.
        self.running: dict[str, Any] = {}
        self.samples_trained = 0  # by this process, for the throughput
        self.stop_signal = 0  # SIGTERM or SIGINT (Ctrl-C), once one asked the run to stop
        self.stop_asked = 0.0  # when (time.monotonic())
        self.pid = os.getpid()  # of this process: a DataLoader worker forks with its signal handlers
        self.stopped = ""  # why fit() stopped before the end, in words
        self.early_stopping = EarlyStopping(config.monitor, config.monitor_mode, config.early_stop_patience)
        stage_optimizers = [stage.optimizer for stage in self.stages]
        self.checkpointer = Checkpointer(self.run_dir, runtime, config, self.trained, stage_optimizers, self.ema)
        self.logger = MetricLogger(self.run_dir, config) if runtime.is_main else None
        flops = getattr(model_file, "flops_per_sample", None)  # model.py's, for MFU on a GPU
        self.throughput = Throughput(config, runtime.device, runtime.world_size, flops)
        self.checkpointer.check_free_space()
        # hooks.py sees the trained models as they train (wrapped: DDP holds yours as .module), the frozen ones too.
        models_view = self.wrapped["model"] if not isinstance(built, dict) else {**self.wrapped, **self.frozen}
        self.run = Run(config, models_view, optimizers, schedulers, runtime.rank, runtime.world_size)
        self.hook = HookCaller(Hooks, config, self.run)

    def fit(self) -> dict[str, Any] | None:
        """Train until --epochs, --max-steps or early stopping, then test and return the summary.

        Returns None when the run stops before its end (--stop-after-epoch, --stop-after-step,
        SIGTERM), with `stopped` saying why: it is checkpointed and unfinished, not tested.
        """
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        started = time.perf_counter()
        stopped_early = False
        updates = self.epoch * self.updates_per_epoch + self.position
        if 0 < self.config.stop_after_epoch <= self.epoch or 0 < self.config.stop_after_step <= updates:
            self.stopped = f"after update {updates}"  # e.g. torchrun restarted the ranks after that checkpoint
            return None
        self.hook("on_run_start", self.run)
        for epoch in range(self.epoch, self.epochs):
            epoch_started = time.perf_counter()
            trained = self.train_epoch(epoch)
            if trained is None:
                return None
            record: dict[str, Any] = {"epoch": epoch + 1, **trained, **self.evaluate("val")}
            record.update(step=self.step, lr=self.stages[0].scheduler.get_last_lr()[0])
            record["epoch_time_s"] = round(time.perf_counter() - epoch_started, 3)
            # Never checkpoint NaN weights, nor pick a best epoch by a NaN metric.
            finite_or_raise(record, f"epoch {epoch + 1}")
            # Every rank holds the same all-reduced metrics, so every rank computes the same result.
            is_best = self.early_stopping.update(record, epoch + 1)
            self.epoch = self.run.epoch = epoch + 1
            # Before the checkpoint, which holds the hooks' state as this hook leaves it.
            self.hook("on_epoch_end", self.run, record)
            if self.logger is not None:
                self.logger.log(record)
            if not self.position:  # a run that ends part-way through this epoch was checkpointed before validating
                self.checkpointer.save(self.state_dict(), f"epoch-{self.epoch:04d}", is_best, self.running)
            # Rank 0 decides and every rank follows, so all ranks leave the loop at the same epoch.
            if distributed.agree(self.early_stopping.should_stop):
                stopped_early = True
                break
            finish, terminate = distributed.any_rank(bool(self.run.stop_reason), bool(self.stop_signal))
            if finish:
                self.run.stop_reason = self.run.stop_reason or "a hook asked, on another rank"
                if self.logger is not None:
                    print(f"stopping: {self.run.stop_reason}", flush=True)
                stopped_early = True
                break
            if terminate or self.epoch == self.config.stop_after_epoch:
                self.stopped = self.stopped_by() + f"after epoch {self.epoch}"
                return None
            if self.epoch * self.updates_per_epoch == self.config.stop_after_step:
                self.stopped = f"after update {self.config.stop_after_step}"
                return None
        return self.test(stopped_early, time.perf_counter() - started - self.evaluator.seconds)

    def train_epoch(self, epoch: int) -> dict[str, float] | None:
        """Train on (the rest of) one epoch; returns the mean training loss of each stage.

        Returns None when the run stops part-way through the epoch (--stop-after-step, SIGTERM),
        after a checkpoint that lets --resume continue from the same update. When the whole run ends
        part-way through the epoch (--max-steps, a hook), it is checkpointed there, before fit
        validates: a longer run resumed from it goes on with this epoch.
        """
        self.set_training(True)
        first, end = self.position, min(self.updates_per_epoch, self.total_updates - epoch * self.updates_per_epoch)
        # A new shuffle every epoch, the same on every rank; a resumed epoch starts where it stopped.
        batches = self.loaders.start_epoch(epoch, first)
        self.hook("on_epoch_start", self.run, epoch + 1)
        self.progress.start(epoch + 1, self.epochs, end, first)
        sums, skipped = self.running_sums(first)
        epoch_totals, window = sums  # views of it: an update adds its totals to both at once
        done, window_samples, epoch_samples = first, 0, 0
        self.throughput.restart(first)
        for update in range(first, end):
            micro_batches, samples = self.loaders.next_update(batches, update)
            window_samples, epoch_samples = window_samples + samples, epoch_samples + samples
            totals, applied = self.update(micro_batches, samples, f"epoch {epoch + 1}, step {self.step}")
            self.step += applied
            self.run.step = self.step
            self.hook("after_update", self.run)
            skipped += not applied
            sums += totals  # to epoch_totals and window
            done = update + 1
            updates = epoch * self.updates_per_epoch + done
            # The epoch end validates anyway (fit).
            validate = self.config.eval_every > 0 and updates % self.config.eval_every == 0 and done != end
            stop = False
            if done % self.config.log_every == 0 or done == self.updates_per_epoch or validate:
                self.log_window(window, epoch, done, window_samples, validate)
                window.zero_()
                window_samples = 0
                # A SIGTERM or a hook's stop may reach some ranks only: if any rank got one, every rank stops here.
                stop, finish = distributed.any_rank(bool(self.stop_signal), bool(self.run.stop_reason))
                self.loaders.check_streams_agree(updates)
                if finish:
                    break  # a hook ends the run: this epoch ends here, and fit validates and checkpoints it
            elif done == end:  # the run ends here, part-way through the epoch: its epoch record logs these updates
                self.check_window(window, epoch)
            if done == end:
                break  # the epoch end checkpoints (fit)
            stop = stop or updates == self.config.stop_after_step
            if stop or (self.config.checkpoint_every and updates % self.config.checkpoint_every == 0):
                self.running = {"totals": epoch_totals, "window": window, "skipped": skipped}
                self.save_within_epoch(epoch, done)
                if stop:
                    self.progress.finish()
                    self.stopped = self.stopped_by() + f"after update {updates}"
                    return None
        self.running = {"totals": epoch_totals, "window": window, "skipped": skipped}
        self.samples_trained += epoch_samples
        return self.end_epoch(epoch, first, done)

    def running_sums(self, first: int) -> tuple[torch.Tensor, int]:
        """Each optimizer's [loss total, weight] summed over the epoch and since the last log, in one tensor of
        [2, optimizers, 2], and the updates skipped: none yet, or as a checkpoint kept them (`first` > 0)."""
        zeros = torch.zeros(len(self.stages), 2, dtype=torch.float64)
        running: dict[str, Any] = self.running if first else {"totals": zeros, "window": zeros, "skipped": 0}
        return torch.stack([running["totals"], running["window"]]).to(self.runtime.device), running["skipped"]

    def update(self, micro_batches: list[Any], samples: int, where: str) -> tuple[torch.Tensor, bool]:
        """One update from this rank's micro-batches (`samples` over all ranks); returns this rank's [loss total,
        weight] of each optimizer, and whether an update was applied (`where` names it in messages)."""
        for model in self.wrapped.values():
            distributed.check_trainable(model)  # hooks run between updates
        if len(self.stages) == 1:  # one optimizer: a micro-batch's loss is what train_step returns
            forwards = [functools.partial(self.train_loss, batch) for batch in micro_batches]
            totals, applied = self.update_stage(self.stages[0], forwards, samples, where)
            totals = totals[None]
        else:
            totals, applied = self.update_each_optimizer(micro_batches, samples, where)
        if applied and self.ema is not None:
            self.ema.update()  # --ema-decay: the average follows every update applied
        self.profiler.step()
        return totals, applied

    def update_stage(
        self, stage: Stage, forwards: Sequence[Callable[[], Mean]], samples: int, where: str
    ) -> tuple[torch.Tensor, bool]:
        """One update of `stage`'s optimizer from this rank's micro-steps (`forwards[i]()` runs micro-step i's
        forward and returns its loss); returns this rank's [loss total, weight] and whether it was applied."""
        # The update must follow the gradient of the global mean loss, sum_i(w_i l_i) / W with W = sum_i(w_i),
        # over every rank and micro-step; W is only known once every micro-step has run.
        multiplier = self.runtime.world_size / self.config.global_batch_size
        losses = []
        for micro_step, forward in enumerate(forwards):
            last = micro_step == len(forwards) - 1
            # DDP averages the ranks' gradients in backward(): only on the last micro-step.
            with distributed.gradient_sync(stage.models, enabled=last):
                with self.autocast():
                    losses.append(loss := forward())
                if last:  # W is known, counted or summed over the ranks while this backward() runs
                    totals = loss_totals(losses)  # this rank's [sum_i(w_i l_i), sum_i(w_i)], for the logs
                    exact = distributed.exact_factor(stage, losses, totals[1], samples, self.config.global_batch_size)
                # A fixed multiplier c = world_size / --global-batch-size (exact already for one
                # loss per sample); after the rank average, grad = (c / W) * sum_i grad(w_i l_i).
                stage.scaler.scale(loss.total * multiplier).backward()
        stage.per = loss.per  # what a unit of weight is (sample, token): the logs count them
        # The exact mean: times --global-batch-size / W (None: exactly 1, a full batch of per-sample losses).
        factor = exact()
        stage.scaler.unscale_(stage.optimizer)  # clip the true gradients, not fp16-scaled ones
        grads = [param.grad for param in stage.params if param.grad is not None]
        if self.config.max_grad_norm > 0 or stage.nan_guard.skips_updates:
            # The exact gradient's norm (the same on every rank); clipping folds into the factor.
            norm = torch.nn.utils.get_total_norm(grads)
            stage.grad_norm = norm if factor is None else norm * factor
            if self.config.max_grad_norm > 0:
                clip = (self.config.max_grad_norm / (stage.grad_norm + 1e-6)).clamp(max=1.0)
                factor = clip if factor is None else clip * factor
            # Reading the norm waits for the GPU: only --nan-policy skip looks at it every update.
            guard = stage.nan_guard
            if guard.skips_updates and not guard.allow_update(distributed.is_finite(stage.grad_norm), where):
                stage.optimizer.zero_grad(set_to_none=True)
                return torch.zeros_like(totals), False  # a dropped update's loss is left out of train_loss
        if factor is not None:
            torch._foreach_mul_(grads, factor)
        scale_before = stage.scaler.get_scale()
        stage.scaler.step(stage.optimizer)
        stage.scaler.update()
        # fp16 skips an update with inf/NaN gradients and lowers the scale: the schedule only advances
        # on updates that happened (reading the scale waits for the GPU: fp16 only).
        if not (stage.scaler.is_enabled() and stage.scaler.get_scale() < scale_before):
            stage.scheduler.step()
        stage.optimizer.zero_grad(set_to_none=True)
        return totals, True

    def train_loss(self, batch: Any) -> Mean:
        """step.py's loss for one micro-batch, with one optimizer."""
        with in_your_code("in train_step"):
            loss = train_step(self.models, batch, self.config)
        return check_train_value(loss, self.stages[0].name)

    def update_each_optimizer(self, micro_batches: list[Any], samples: int, where: str) -> tuple[torch.Tensor, bool]:
        """Several optimizers (a GAN): train_step is a generator that yields (name, Mean) once per optimizer,
        in optim.py's order. Each optimizer updates before the generators go on, so the next loss sees its
        new weights; while one runs, only its weights take gradients."""
        first = self.stages[0].name
        steps = [micro_step_losses(train_step, self.models, batch, self.config, first) for batch in micro_batches]
        totals, applied = [], False
        for stage in self.stages:
            with only_training(stage, self.stages):
                forwards = [functools.partial(next_loss, step, stage, self.stages) for step in steps]
                stage_totals, stage_applied = self.update_stage(stage, forwards, samples, where)
            totals.append(stage_totals)
            applied |= stage_applied
        check_all_used(steps, self.stages)
        return torch.stack(totals), applied

    def set_training(self, training: bool) -> None:
        """Train or eval mode for the trained models; frozen ones always evaluate."""
        for model in self.wrapped.values():
            model.train(training and not self.config.train_in_eval_mode)

    def end_epoch(self, epoch: int, first: int, done: int) -> dict[str, float]:
        """The epoch's mean training loss of each stage, after update `done`; a run that ends part-way
        through the epoch is checkpointed here, before fit validates."""
        self.progress.finish()
        if done == self.updates_per_epoch:
            self.position = 0
        elif done > first:
            self.save_within_epoch(epoch, done)
        result = mean_losses("train", self.stages, distributed.all_reduce_sum(self.running["totals"]).tolist())
        if self.stages[0].nan_guard.skips_updates:
            result["skipped_updates"] = self.running["skipped"]
        return result

    def save_within_epoch(self, epoch: int, done: int) -> None:
        """Checkpoint after update `done` of `epoch`."""
        self.position = done
        updates = epoch * self.updates_per_epoch + done
        self.checkpointer.save(self.state_dict(), f"epoch-{epoch + 1:04d}-step-{updates:08d}", False, self.running)

    def log_window(self, window: torch.Tensor, epoch: int, done: int, samples: int, validate: bool) -> None:
        """Check and log the training loss of the updates since the last call (`samples` in all); validate if asked.

        One small all-reduce every --log-every updates: the global running loss, checked for NaN/inf on every
        rank alike so all ranks stop together. Reading it waits for the GPU, so the speed is measured here too.
        """
        record: dict[str, Any] = {"epoch": epoch + 1, "step": self.step}
        sums, losses = self.check_window(window, epoch)
        record.update(losses)
        trained = (done - self.position) * self.config.global_batch_size  # since this epoch (re)started
        self.progress.update(done, trained, next(iter(losses.values())))
        record.update(lr=self.stages[0].scheduler.get_last_lr()[0], **grad_norms(self.stages))
        record.update(self.throughput.figures(done, samples, sums[0][1], self.stages[0].per))
        if validate:
            record.update(self.evaluate("val"))
            self.set_training(True)
        record.update(self.hook.added("on_log", record))
        if self.logger is not None:
            self.logger.log_step(record)
        self.throughput.restart(done)

    def check_window(self, window: torch.Tensor, epoch: int) -> tuple[list[list[float]], dict[str, float]]:
        """The global loss sums and mean training losses of the updates since the last log, checked for NaN/inf
        on every rank alike so all ranks stop together."""
        sums = distributed.all_reduce_sum(window.clone()).tolist()
        return sums, check_finite(mean_losses("train", self.stages, sums), sums, f"epoch {epoch + 1}, step {self.step}")

    def evaluate(self, split: str) -> dict[str, float]:
        """The loss and metrics over every sample of `split` ("val" or "test"), each counted once."""
        self.set_training(False)
        results = self.evaluator.evaluate(split)
        return {**results, **self.hook.added("after_evaluation", split, results)}

    def state_dict(self) -> dict[str, Any]:
        """Everything besides weights and optimizers that a resumed run needs."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "position": self.position,
            **stages_state(self.stages),
            "early_stopping": self.early_stopping.state_dict(),
            "data": self.loaders.state_dict(),
            "hooks": self.hook("state_dict"),
            "config": dataclasses.asdict(self.config),
        }

    def resume(self) -> None:
        """Continue from the latest checkpoint in the run directory, at the update it was written after."""
        path, checkpoint = self.checkpointer.load_latest()
        check_resumable(self.config, checkpoint["config"])
        self.checkpointer.restore(path, checkpoint)
        # The epoch of the run that wrote it: a stream's is that run's --max-steps, which this one may extend.
        per_epoch = checkpoint["config"]["max_steps"] if self.loaders.stream is not None else self.updates_per_epoch
        done = checkpoint["epoch"] * per_epoch + checkpoint.get("position", 0)
        if done > self.total_updates:
            config = self.config
            asked = f"--max-steps {config.max_steps}" if config.max_steps else f"--epochs {config.epochs}"
            raise ConfigError(
                f"--resume: the run in {self.run_dir} has done {done} updates, more than {asked} asks for "
                f"({self.total_updates}); ask for at least {done}, or start a new --run-dir"
            )
        self.epoch, self.position = divmod(done, self.updates_per_epoch)
        self.step = checkpoint["step"]
        if self.position:
            self.running = self.checkpointer.running_totals(checkpoint)
        load_stages_state(self.stages, checkpoint)
        self.early_stopping.load_state_dict(checkpoint["early_stopping"])
        self.loaders.load_state_dict(checkpoint.get("data", {}))
        self.hook("load_state_dict", checkpoint.get("hooks", {}))
        self.run.epoch, self.run.step = self.epoch, self.step
        problem = self.logger.keep_until(self.epoch, self.step) if self.logger is not None else ""
        # Only rank 0 keeps the logs, but every rank must learn whether it could, or they would wait for it.
        if distributed.agree(bool(problem)):
            raise RunError(problem or "rank 0 could not read the run's logs; see its output")
        if self.logger is not None:
            print(f"resumed after update {done}, {self.place()}", flush=True)

    def place(self) -> str:
        """Where in its epochs the run is, in words (epochs counted from 1)."""
        if self.position:
            return f"part-way through epoch {self.epoch + 1} (update {self.position} of {self.updates_per_epoch})"
        return f"the end of epoch {self.epoch}"

    def _request_stop(self, signum: int, frame: object) -> None:
        """SIGTERM or Ctrl-C: stop at the next --log-every boundary, with a checkpoint. A second Ctrl-C: now."""
        if os.getpid() != self.pid:  # a worker forked a moment ago, before its worker_init_fn ignores signals
            return
        if self.stop_signal:
            # torchrun hands a Ctrl-C on to its ranks, which had it from the terminal: only a later one counts.
            if signum == signal.SIGINT and time.monotonic() - self.stop_asked > 1.0:
                raise KeyboardInterrupt
            return
        self.stop_signal, self.stop_asked = signum, time.monotonic()
        if self.runtime.is_main:
            again = " (Ctrl-C again to stop at once, without one)" if signum == signal.SIGINT else ""
            print(f"{SIGNALS[signum]}: stopping at the next --log-every boundary, with a checkpoint{again}", flush=True)

    def stopped_by(self) -> str:
        return f"by {SIGNALS[self.stop_signal]} " if self.stop_signal else ""

    def test(self, stopped_early: bool, train_seconds: float) -> dict[str, Any]:
        """Evaluate the best (or last) checkpoint on the test set; returns the summary train.py writes.

        Without a test set (data.py's is None) the summary gives the best epoch's validation figures.
        """
        signal.signal(signal.SIGINT, signal.default_int_handler)  # training is over: Ctrl-C stops at once
        summary: dict[str, Any] = {
            "epochs_run": self.epoch,
            "steps": self.step,
            "stopped_early": stopped_early,
            "best_epoch": self.early_stopping.best_epoch,
            f"best_{self.config.monitor}": self.early_stopping.best,
        }
        if self.loaders.test is None:
            summary.update(self.early_stopping.best_validation)
        else:
            summary.update(tested_checkpoint=self.load_tested(), **self.evaluate("test"))
        if self.samples_trained:  # a finished run tested again trains nothing
            # Training alone: the time spent validating is eval_time_s, with the test's.
            summary["train_time_s"] = round(train_seconds, 2)
            summary["train_samples_per_s"] = round(self.samples_trained / max(train_seconds, 1e-9), 1)
        summary["eval_time_s"] = round(self.evaluator.seconds, 2)
        if self.run.stop_reason:
            summary["stop_reason"] = self.run.stop_reason
        self.hook("on_run_end", self.run, summary)
        if self.logger is not None:
            self.logger.close(summary)
        return summary

    def load_tested(self) -> str:
        """Load the weights the final test uses (--test-on), and say which they are."""
        if self.config.test_on == "last":
            return "last"
        if self.position and self.early_stopping.best_epoch == self.epoch:
            return f"best (epoch {self.epoch}, the final weights)"  # validated part-way: never linked as best.pt
        return self.checkpointer.load_best(self.early_stopping.best_epoch)


if __name__ == "__main__":
    exit_code = main()
    # Leave without the interpreter's teardown: a finished rank was seen, rarely, to abort there
    # ("terminate called without an active exception") while C++ threads of torch.distributed
    # were being destroyed, turning a successful run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
