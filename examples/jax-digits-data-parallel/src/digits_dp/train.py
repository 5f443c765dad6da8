"""Train digits_dp: the whole loop on one page. Managed by the looptpl template.

Launch:
    python -m digits_dp.train                        # every accelerator of this machine, else the CPU
    python -m digits_dp.train --cpu-devices 2        # 2 devices on the CPU, no GPU needed
    python -m digits_dp.kit.launch --processes 2 -- --cpu-devices 1     # 2 processes on this machine
    python -m digits_dp.train --resume               # continue the run in --run-dir

Read it top to bottom: `main` sets up the device mesh, `Trainer` builds the run (model, optimizer, the
compiled update and evaluation), `fit` runs the epochs and `train_epoch` the updates. `make_update`
is the update itself, one compiled function: the exact gradient of the global-batch mean with the
micro-steps scanned (`make_gradient`), clipping, the optimizer (each of several in turn, a GAN's).
distributed.py holds the mesh and how batches are placed on it; your code lives in
data.py, model.py, step.py, loss.py, metrics.py, optim.py, hooks.py and settings.py.
"""

import json
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from . import distributed
from .data import build_datasets
from .distributed import Runtime
from .hooks import Hooks
from .kit.callbacks import EarlyStopping, HookCaller, Run
from .kit.checkpoint import Checkpoints
from .kit.collect import Mean, check_dataset_figures, check_eval_values, only_rows, stage_loss
from .kit.config import FIXED_FOR_A_RUN, TrainConfig, check_resumable, parse_config
from .kit.errors import CheckpointError, ConfigError, RunError, TrainingError, in_your_code, report, three_datasets
from .kit.logs import MetricLogger, ProgressBar, UpdateSpeed
from .kit.precision import computing_in
from .kit.randomness import sample_keys_of
from .kit.rundir import prepare_run_dir
from .kit.runs import closing_lines, opening_line
from .kit.sampling import GlobalBatch, TrainOrder, eval_batches, take
from .kit.stages import Stages
from .kit.streaming import TrainStream, is_stream, stream_eval_batches
from .metrics import dataset_metrics
from .model import build_model
from .optim import build_optimizer
from .step import eval_step, train_step


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    try:
        return run(config, distributed.setup(config))  # the devices first
    except RunError as error:
        report(f"error: {error}", every_rank=error.on_every_rank)
        return error.exit_code
    except KeyboardInterrupt:  # Ctrl-C before training started, or a second one during it
        report("error: stopped by Ctrl-C; a run that wrote a checkpoint continues with --resume")
        return 130


# The signals that stop a run, as people name them.
SIGNALS: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def run(config: TrainConfig, runtime: Runtime) -> int:
    """Train, test and write the summary; returns the exit status."""
    started = time.monotonic()
    config = prepare_run_dir(config, runtime)
    run_dir = Path(config.run_dir)
    with in_your_code("building the datasets"):
        splits = three_datasets(build_datasets(config))
    trainer = Trainer(config, runtime, splits)
    if runtime.is_main:  # the first line on the screen: where the run trains, and how much
        where = distributed.where(runtime, trainer.state)
        weights = sum(leaf.size for leaf in jax.tree.leaves(trainer.state["params"]))
        shape = (trainer.epochs, trainer.order.updates_per_epoch, config.global_batch_size)
        print(opening_line(run_dir, where, weights, trainer.order.size, shape), flush=True)
    if config.resume:
        trainer.resume()
    summary = trainer.fit()
    trainer.checkpoints.wait()  # with --async-checkpoints, the last checkpoint is written before the run ends
    if summary is None:
        if runtime.is_main:
            again = f"--resume --run-dir {config.run_dir}"
            print(f"stopped {trainer.stopped}, checkpointed; continue with {again}", flush=True)
        # 128 + the signal (130 for Ctrl-C, 143 for SIGTERM) tells a scheduler the job was stopped, not finished.
        return 128 + trainer.stop_signal if trainer.stop_signal else 0
    if runtime.is_main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print("\n".join(closing_lines(summary, run_dir, time.monotonic() - started, __package__)), flush=True)
    return 0


# The training state, as arrays: the weights, the rest of the model's state, the optimizer's state, the updates done.
State = dict[str, Any]


class Trainer:
    """One run: the model's state, the compiled update and evaluation, the data order, the checkpoints."""

    def __init__(self, config: TrainConfig, runtime: Runtime, splits: tuple[Any, Any, Any]) -> None:
        self.config, self.runtime = config, runtime
        self.train_split, self.val_split, self.test_split = splits
        # The global batches: of each epoch's shuffle, or of a stream (one epoch of --max-steps updates) in its order.
        self.order: TrainOrder | TrainStream = (
            TrainStream(self.train_split, config)
            if is_stream(self.train_split)
            else TrainOrder(
                self.train_split, config.global_batch_size, config.grad_accum_steps, config.seed, config.steps_per_epoch
            )
        )
        self.epochs = config.epochs if not config.max_steps else -(-config.max_steps // self.order.updates_per_epoch)
        self.total_updates = config.max_steps or self.epochs * self.order.updates_per_epoch
        with in_your_code("building the model"), distributed.building(runtime):
            model = build_model(config, nnx.Rngs(config.seed))
        with in_your_code("building the optimizer"):
            self.stages = Stages(build_optimizer(config, self.total_updates), config.max_grad_norm)
        # The model's structure, and its state as arrays: the compiled functions take and return arrays. The
        # weights, by the optimizer that trains them; and the rest: what no optimizer trains (BatchNorm's
        # running statistics, which the model updates itself as it runs; frozen weights).
        self.graphdef, params, rest = self.stages.split(model)
        opt_state = {name: optimizer.init(params[name]) for name, optimizer in self.stages.optimizers.items()}
        state: State = {"params": params, "rest": rest, "opt_state": opt_state}
        if config.ema_decay:  # the weights' moving average, from a copy of them
            state["ema"] = jax.tree.map(jnp.copy, params)
        if config.nan_policy == "skip":  # each stage's updates skipped in a row, up to the last one
            state["streak"] = jnp.zeros(len(params), jnp.int32)
        self.state = distributed.place(state | {"updates": jnp.zeros((), jnp.int32)}, runtime)
        placement = jax.tree.map(lambda array: array.sharding, self.state)  # each array's devices, kept by the update
        self.update = make_update(self.graphdef, self.stages, config, placement)
        self.evaluate_batch, self.units = make_evaluation(self.graphdef, config)
        folder = Path(config.run_dir) / "checkpoints"
        self.checkpoints = Checkpoints(folder, config.keep_checkpoints, config.async_checkpoints)
        self.epoch, self.position, self.updates = 0, 0, 0  # where the run is: epoch, updates done in it, in all
        self.running = self.stages.zeros()  # per stage, the epoch's [sum of w_i l_i, sum of w_i, updates skipped]
        self.early_stopping = EarlyStopping(config.monitor, config.monitor_mode, config.early_stop_patience)
        self.logger = MetricLogger(Path(config.run_dir), config) if runtime.is_main else None
        self.progress = ProgressBar(config.progress and runtime.is_main)
        self.speed = UpdateSpeed()
        self.stop_signal, self.stopped = 0, ""
        # hooks.py: what it sees of the run, and its methods, called at fixed points of the run.
        self.run = Run(config, jax.process_index(), jax.process_count(), self.current_model)
        self.shown: State | None = None  # the state run.model() holds, if not the training state
        self.hook = HookCaller(Hooks, config, self.run)
        for signum in SIGNALS:
            signal.signal(signum, self._request_stop)

    def fit(self) -> dict[str, Any] | None:
        """Train the remaining epochs, validating after each (the best so far by --monitor is checkpointed as
        such; --early-stop-patience or a hook may end the run early); then test. None if stopped part-way."""
        self.hook("on_run_start", self.run)
        stopped_early = False
        for epoch in range(self.epoch, self.epochs):
            train_losses = self.train_epoch(epoch)
            if train_losses is None:
                return None
            record = {"epoch": epoch + 1, "step": self.updates, **train_losses, **self.evaluate("val")}
            if self.config.nan_policy == "skip":
                record["skipped_updates"] = int(self.running[:, 2].sum())
            is_best = self.early_stopping.update(record, epoch + 1)  # the same on every process: global figures
            self.epoch, self.position, self.running = epoch + 1, 0, self.stages.zeros()
            self.run.epoch = self.epoch
            self.hook("on_epoch_end", self.run, record)  # before the checkpoint, which holds the hooks' state
            if self.logger is not None:
                self.logger.log(record)
            self.save(best=is_best)
            if self.early_stopping.should_stop or self.hook_stops():
                stopped_early = True
                break
        return self.test(stopped_early)

    def test(self, stopped_early: bool) -> dict[str, Any]:
        """The run's summary: the best epoch, and the test split's figures on the best (or last) weights."""
        best = self.early_stopping
        summary: dict[str, Any] = {"epochs_run": self.epoch, "steps": self.updates, "stopped_early": stopped_early}
        summary |= {"best_epoch": best.best_epoch, f"best_{self.config.monitor}": best.best}
        if self.run.stop_reason:
            summary["stop_reason"] = self.run.stop_reason
        if self.test_split is None:  # the best epoch's validation figures instead
            summary |= best.best_validation
        elif self.config.test_on == "last" or best.best_epoch == self.epoch:
            which = "last" if self.config.test_on == "last" else f"best (epoch {best.best_epoch}, the final weights)"
            summary |= {"tested_checkpoint": which, **self.evaluate("test")}
        else:  # the best epoch's checkpoint, saved at its end
            best_end = min(best.best_epoch * self.order.updates_per_epoch, self.total_updates)
            weights, _ = self.checkpoints.restore(best_end, self.state)
            summary |= {"tested_checkpoint": f"best (epoch {best.best_epoch})", **self.evaluate("test", weights)}
        self.hook("on_run_end", self.run, summary)
        if self.logger is not None:
            self.logger.close(summary)
        return summary

    def hook_stops(self) -> bool:
        """Whether a hook asked to end the run (`run.request_stop`), on any process: then every process stops."""
        if not distributed.any_process(bool(self.run.stop_reason)):
            return False
        self.run.stop_reason = self.run.stop_reason or "a hook asked, on another process"
        if self.runtime.is_main:
            print(f"stopping: {self.run.stop_reason}", flush=True)
        return True

    def train_epoch(self, epoch: int) -> dict[str, float] | None:
        """Train on (the rest of) one epoch; its mean training loss (each stage's), or None if stopped part-way
        (checkpointed): by --stop-after-step, SIGTERM or Ctrl-C. A hook that ends the run ends the epoch at the next
        --log-every updates."""
        self.hook("on_epoch_start", self.run, epoch + 1)
        end = min(self.order.updates_per_epoch, self.total_updates - epoch * self.order.updates_per_epoch)
        self.progress.start(epoch + 1, self.epochs, end, self.position)
        self.speed.restart(self.position, 0)
        pending = []  # each update's sums since the last check, still on the devices
        samples = 0  # trained in this epoch since it (re)started
        for update in range(self.position, end):
            batch = self.order.update(epoch, update)
            self.state, sums = self.update(self.state, *self.load(batch), batch.epoch)
            pending.append(sums)
            self.position, self.updates, samples = update + 1, self.updates + 1, samples + batch.samples
            self.run.step = self.updates
            self.hook("after_update", self.run)
            stop = False
            # --eval-every: validate inside the epoch too (its end validates anyway), logged to steps.jsonl.
            validate = bool(self.config.eval_every) and self.updates % self.config.eval_every == 0
            validate = validate and self.position != end
            if self.position % self.config.log_every == 0 or self.position == end or validate:
                self.log_window(pending, epoch, samples, validate)
                pending = []
                # A SIGTERM may reach some processes only: if any got one, every process stops here.
                stop = distributed.any_process(bool(self.stop_signal))
                if distributed.any_process(bool(self.run.stop_reason)):  # a hook ends the run: the epoch ends here
                    break  # and fit validates, checkpoints and tests
            stop = stop or self.updates == self.config.stop_after_step
            every = self.config.checkpoint_every
            if self.position < end and (stop or (every and self.updates % every == 0)):
                if pending:  # a checkpoint carries the epoch's loss so far
                    self.log_window(pending, epoch, samples)
                    pending = []
                self.save()
                if stop:
                    self.progress.finish()
                    self.stopped = f"by {SIGNALS[self.stop_signal]} " if self.stop_signal else ""
                    self.stopped += f"after update {self.updates}"
                    return None
        self.progress.finish()
        return self.stages.losses(self.running)

    def log_window(self, pending: list[jax.Array], epoch: int, samples: int, validate: bool = False) -> None:
        """The updates since the last check: their loss sums added to the epoch's, checked for NaN/inf, logged to
        steps.jsonl with the validation figures if `validate`. Reading them waits for the devices: only every
        --log-every updates."""
        self.check_stream_place()
        sums = np.asarray(jax.device_get(jnp.stack(pending)), dtype=np.float64)  # [updates, stages, 4]
        window, streak = sums[..., :3].sum(axis=0), int(sums[..., 3].max())  # [total, weight, skipped]; in a row
        if not np.isfinite(window).all():
            raise TrainingError(f"the loss became NaN or inf by update {self.updates}; lower --lr or --max-grad-norm")
        if streak > self.config.max_consecutive_skips:
            raise TrainingError(
                f"the gradients were NaN/inf for {streak} updates in a row by update {self.updates}, more than "
                f"--max-consecutive-skips {self.config.max_consecutive_skips}: lower --lr or --max-grad-norm"
            )
        if window[:, 2].any() and self.runtime.is_main:
            skipped = f"{int(window[:, 2].sum())} update(s) skipped, by update {self.updates}"
            print(f"warning: NaN/inf gradients: {skipped} (--nan-policy skip)", flush=True)
        self.running += window
        losses = self.stages.losses(window)
        self.progress.update(self.position, samples, next(iter(losses.values())))
        record = {"epoch": epoch + 1, "step": self.updates, **losses}
        record |= self.speed.figures(self.position, samples)
        if validate:  # every process evaluates: the figures are global
            record |= self.evaluate("val")
        record |= self.hook.added("on_log", record)
        if self.logger is not None:
            self.logger.log_step(record)
        self.speed.restart(self.position, samples)

    def check_stream_place(self) -> None:
        """With a stream, check that every process is at the same place of it (every process must call this).
        Each reads the whole stream: streams of different lengths would train the processes on different passes."""
        if not isinstance(self.order, TrainStream):
            return
        place = self.order.place()
        if distributed.any_process(distributed.process0_number(place) != place):
            raise self.order.out_of_step(self.updates)

    def load(self, batch: GlobalBatch) -> tuple[Any, jax.Array, jax.Array]:
        """A batch as global arrays [micro-steps, rows, ...]: its samples, which rows are samples, and their
        indices in the split (a stream's: their places in its pass). This process loads only its own rows."""
        mine = distributed.local_rows(batch.indices.shape[1], self.runtime)
        indices = batch.indices[:, mine]
        with in_your_code("loading a batch"):
            local = take(batch.source, indices)
        return distributed.global_batch((local, batch.rows[:, mine], indices.astype(np.int32)), 1, self.runtime)

    def evaluate(self, split_name: str, state: State | None = None) -> dict[str, float]:
        """Every value eval_step returns, averaged over the whole split: val_<name> or test_<name>, of the
        training state's weights (or those of `state`); with --ema-decay, of their moving average too, named
        val_ema_<name> or test_ema_<name>; and what hooks.py's after_evaluation adds."""
        state = state or self.state
        figures = self.evaluate_weights(split_name, state["params"], state["rest"])
        if "ema" in state:
            averaged = self.evaluate_weights(split_name, state["ema"], state["rest"])
            del averaged[f"{split_name}_samples"]
            figures |= {name.replace(split_name, f"{split_name}_ema", 1): value for name, value in averaged.items()}
        self.shown = state  # what run.model() holds in after_evaluation: the weights evaluated
        figures |= self.hook.added("after_evaluation", split_name, figures)
        self.shown = None
        return figures

    def evaluate_weights(self, split_name: str, params: dict[str, nnx.State], rest: nnx.State) -> dict[str, float]:
        """The figures of the model with these weights on the split `split_name`: each Mean of eval_step averaged
        over the split, and metrics.py's dataset_metrics of those and of every Gather's rows."""
        split = self.val_split if split_name == "val" else self.test_split
        totals: dict[str, np.ndarray] = {}
        gathered: dict[str, list[np.ndarray]] = {}
        samples = 0
        used = self.config.eval_batches * self.config.eval_batch_size  # 0: the whole split
        read = stream_eval_batches if is_stream(split) else eval_batches
        for batch in read(split, used, self.config.eval_batch_size, split_name):
            arrays, rows, _ = self.load(batch)
            sums, batch_gathered = distributed.to_host(self.evaluate_batch(params, rest, arrays, rows))
            for name, pair in sums.items():
                totals[name] = totals.get(name, 0.0) + np.asarray(pair, dtype=np.float64)
            for name, values in batch_gathered.items():  # a Gather's rows of samples, the padding left out
                gathered.setdefault(name, []).append(values[batch.rows[0] == 1])
            samples += batch.samples
        means = {name: float(total / max(weight, 1e-12)) for name, (total, weight) in totals.items()}
        with in_your_code(f"in dataset_metrics on the {split_name} split"):
            extra = dataset_metrics(means, {name: np.concatenate(parts) for name, parts in gathered.items()})
        figures = means | check_dataset_figures(extra, means)
        figures = {f"{split_name}_{name}": value for name, value in figures.items()}
        for per, name in self.units.items():
            if per != "sample":  # the weight of a per-token Mean: the split's real tokens
                figures[f"{split_name}_{per}s"] = int(totals[name][1])
        return {**figures, f"{split_name}_samples": samples}

    def save(self, best: bool = False) -> None:
        """Checkpoint the state and where the run is in its data, as the best so far if `best` (every process
        calls this)."""
        position: dict[str, Any] = {"epoch": self.epoch, "position": self.position, "updates": self.updates}
        position["running"] = self.running.tolist()  # the epoch's loss sums so far
        position["early_stopping"] = self.early_stopping.state_dict()
        position["hooks"] = self.hook.state_json()  # hooks.py's state_dict
        position |= self.order.state_dict()  # a stream's place: its pass, and the batches of it done
        fixed = [name for name in FIXED_FOR_A_RUN if hasattr(self.config, name)]
        position["config"] = {name: getattr(self.config, name) for name in fixed}  # a resumed run must keep them
        self.checkpoints.save(self.updates, self.state, position, best)

    def resume(self) -> None:
        """Go on from the newest finished checkpoint of --run-dir, exactly where it stopped."""
        latest = self.checkpoints.latest()
        if latest is None:
            raise CheckpointError(f"--resume: no finished checkpoint in {self.checkpoints.folder}; drop --resume")
        self.state, position = self.checkpoints.restore(latest, self.state)
        check_resumable(self.config, position["config"])
        self.epoch, self.position, self.updates = position["epoch"], position["position"], position["updates"]
        self.running = np.asarray(position["running"], dtype=np.float64)
        self.early_stopping.load_state_dict(position["early_stopping"])
        self.hook("load_state_dict", json.loads(position["hooks"]))
        self.order.load_state_dict(position)
        if self.logger is not None and (problem := self.logger.keep_until(self.epoch, self.updates)):
            raise ConfigError(f"--resume: {problem}")
        if self.epoch < self.epochs and self.position >= self.order.updates_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        self.run.epoch, self.run.step = self.epoch, self.updates

    def current_model(self) -> nnx.Module:
        """The model with the training state's weights (or the evaluated ones), in eval mode: a hook's `run.model()`."""
        state = self.shown or self.state
        model = nnx.merge(self.graphdef, *state["params"].values(), state["rest"])
        model.eval()
        return model

    def _request_stop(self, signum: int, frame: object) -> None:
        """SIGTERM or Ctrl-C: stop at the next --log-every boundary, with a checkpoint. A second Ctrl-C: now."""
        if self.stop_signal == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.stop_signal = signum
        if self.runtime.is_main:
            print(f"{SIGNALS[signum]}: stopping at the next --log-every boundary, with a checkpoint", flush=True)


def make_update(graphdef: nnx.GraphDef, stages: Stages, config: TrainConfig, placement: Any) -> Callable:
    """The compiled update: the state after one optimizer update on a global batch (one per optimizer, with
    several, each on the exact gradient of `make_gradient`), and each stage's [loss total, weight, skipped,
    skipped in a row]."""
    stage_gradient = make_gradient(graphdef, stages, config)

    def update(
        state: State, batches: Any, rows: jax.Array, indices: jax.Array, epoch: jax.Array
    ) -> tuple[State, jax.Array]:
        params, opt_state = dict(state["params"]), dict(state["opt_state"])
        sums, streaks, stepped = [], [], jnp.array(False)
        for index, (name, optimizer) in enumerate(stages.optimizers.items()):  # with several, one after another
            # Each stage runs from the model's rest before the update: a later one runs the steps of those before
            # it again, up to its own yield. The last one's rest is kept.
            grads, rest, total = stage_gradient(name, params, state["rest"], (batches, rows, indices), epoch)
            changes, new_opt_state = optimizer.update(grads, opt_state[name], params[name])
            new_params = optax.apply_updates(params[name], changes)
            stage_sums = jnp.concatenate([total, jnp.zeros(2)])  # [loss total, weight, skipped, skipped in a row]
            if "streak" in state:  # --nan-policy skip: a stage whose gradient is NaN or inf changes nothing
                finite = jnp.isfinite(optax.global_norm(grads))
                new_params, new_opt_state = jax.tree.map(
                    partial(jnp.where, finite), (new_params, new_opt_state), (params[name], opt_state[name])
                )
                streaks.append(jnp.where(finite, 0, state["streak"][index] + 1))
                stage_sums = jnp.where(finite, stage_sums, jnp.stack([0.0, 0.0, 1.0, streaks[-1].astype(jnp.float32)]))
                stepped = stepped | finite
            params[name], opt_state[name] = new_params, new_opt_state
            sums.append(stage_sums)
        new_state = {"params": params, "rest": rest, "opt_state": opt_state, "updates": state["updates"] + 1}
        if "ema" in state:  # --ema-decay: the average follows every update; the first one copies the weights
            rate = jnp.where(state["updates"] == 0, 1.0, 1.0 - config.ema_decay)
            new_state["ema"] = jax.tree.map(lambda average, new: average + rate * (new - average), state["ema"], params)
        if "streak" in state:  # an update where every stage skipped leaves the rest, the average and the count
            for kept in ("rest", "ema", "updates"):
                if kept in state:
                    new_state[kept] = jax.tree.map(partial(jnp.where, stepped), new_state[kept], state[kept])
            new_state["streak"] = jnp.stack(streaks)
        # Placed as the old state is (`placement`, from distributed.place): stated, not left to the compiler.
        return jax.lax.with_sharding_constraint(new_state, placement), jnp.stack(sums)

    return jax.jit(update, donate_argnums=0)  # the old state's buffers hold the new one


def make_gradient(graphdef: nnx.GraphDef, stages: Stages, config: TrainConfig) -> Callable:
    """The gradient of one stage (the whole model, with one optimizer) on a global batch, traced into the update.

    The update must follow the gradient of the global mean loss, sum_i(w_i l_i) / W with W = sum_i(w_i),
    over every device and micro-step. The micro-steps (the batch's first axis) are scanned, each adding the
    gradient of its sum_i(w_i l_i) and its W; the sum is divided by W once, at the end. The arrays are global,
    so these sums already run over every device: nothing else to average.
    """

    def loss_sums(
        trained: nnx.State, name: str, params: dict[str, nnx.State], rest: nnx.State, micro_batch: tuple, epoch: Any
    ) -> tuple[jax.Array, tuple[jax.Array, nnx.State]]:
        """The sum of w_i l_i of the stage `name` on one micro-batch, differentiated by `trained` (its weights);
        and its W, and the rest of the model's state as the step left it (new running statistics)."""
        batch, rows, indices = micro_batch
        weights = computing_in(config.precision, params | {name: trained})  # --precision bf16: bfloat16 copies
        model = nnx.merge(graphdef, *weights.values(), rest, copy=True)  # a copy: the step may change its rest
        batch = computing_in(config.precision, batch)
        with only_rows(rows), sample_keys_of(config.seed, epoch, indices), in_your_code("in train_step"):
            # With several optimizers train_step runs up to this stage's yield, on the weights as they are now.
            loss = stage_loss(train_step(model, batch, config), stages.names, list(params).index(name))
        return loss.total, (loss.weight, stages.split(model)[2])

    def stage_gradient(
        name: str, params: dict[str, nnx.State], rest: nnx.State, micro_batches: tuple, epoch: Any
    ) -> tuple[nnx.State, nnx.State, jax.Array]:
        """The exact gradient of the stage `name` over the micro-batches, the model's rest after them, and the
        stage's [loss total, weight]."""

        def micro_step(sums: tuple, micro_batch: tuple) -> tuple[tuple, None]:
            grads, rest, total = sums  # so far: the gradient, the model's rest, the [loss total, weight]
            (micro_total, (micro_weight, rest)), micro_grads = jax.value_and_grad(loss_sums, has_aux=True)(
                params[name], name, params, rest, micro_batch, epoch
            )
            total += jnp.stack([micro_total, micro_weight])
            return (jax.tree.map(jnp.add, grads, micro_grads), rest, total), None

        start = (jax.tree.map(jnp.zeros_like, params[name]), rest, jnp.zeros(2, jnp.float32))
        (grads, rest, total), _ = jax.lax.scan(micro_step, start, micro_batches)
        return jax.tree.map(lambda grad: grad / jnp.maximum(total[1], 1e-12), grads), rest, total  # divided once

    return stage_gradient


def make_evaluation(graphdef: nnx.GraphDef, config: TrainConfig) -> tuple[Callable, dict[str, str]]:
    """The compiled evaluation of one batch: each Mean's [total, weight] over the batch's samples, and each
    Gather's rows. And what a unit of weight is (`Mean(per=...)`: sample, token) with the first value counting
    it, known once traced."""
    units: dict[str, str] = {}

    def evaluate(
        params: dict[str, nnx.State], rest: nnx.State, batch: Any, rows: jax.Array
    ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        model = nnx.merge(graphdef, *computing_in(config.precision, params).values(), rest)
        model.eval()  # BatchNorm with its running statistics, nnx.Dropout off
        batch, rows = jax.tree.map(lambda array: array[0], computing_in(config.precision, batch)), rows[0]  # one batch
        with only_rows(rows), in_your_code("in eval_step"):
            values = check_eval_values(eval_step(model, batch, config))
        sums, gathered = {}, {}
        for name, value in values.items():
            if isinstance(value, Mean):
                units.setdefault(value.per, name)
                sums[name] = jnp.stack([value.total, value.weight])
            else:  # a Gather's rows, bfloat16 ones as float32 (NumPy has no bfloat16 of its own)
                gathered[name] = value.rows.astype(jnp.float32) if value.rows.dtype == jnp.bfloat16 else value.rows
        return sums, gathered

    return jax.jit(evaluate), units


if __name__ == "__main__":
    sys.exit(main())
