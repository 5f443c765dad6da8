"""Your hooks: code the loop runs at fixed points of a run, so you never edit the loop itself.

This file is yours: `copier update` keeps your edits here.

Every process calls every hook, at the same point of the run and with the same values; print, plot
and write files from one process only: `if run.is_main`. The update is compiled once, so a hook
does not change how it trains: make the learning rate move with an Optax schedule in optim.py. A
hook reads the run, calls the model of the moment (`run.model()`), adds values to the logs and
decides when the run ends. docs/jax.md has worked examples.
"""

from typing import Any

from .kit.api import Run
from .kit.config import TrainConfig


class Hooks:
    """One object per run. The loop calls its methods; these defaults do nothing, and a method
    you delete does nothing either."""

    def __init__(self, config: TrainConfig) -> None:
        # Nothing here is required. Set up what your hooks keep; state_dict puts it in the checkpoints.
        self.config = config

    def on_run_start(self, run: Run) -> None:
        """Before the first update, once the model, optimizer and data are ready (and restored, on --resume)."""

    def on_epoch_start(self, run: Run, epoch: int) -> None:
        """Before epoch `epoch` (1, 2, ...) trains; a resumed epoch starts again here."""

    def after_update(self, run: Run) -> None:
        """After each update (`run.step` counts them). It runs once per update: keep it cheap, and
        read no array's value here (`float(x)` waits for the devices every update)."""

    def on_log(self, run: Run, record: dict[str, Any]) -> dict[str, float]:
        """Every --log-every updates, with the steps.jsonl record (its training loss, and the
        validation at --eval-every updates); return values to add to it, under new names."""
        return {}

    def after_evaluation(self, run: Run, split: str, results: dict[str, float]) -> dict[str, float]:
        """After evaluating `split` ("val" or "test"); return values to log beside `results`, under
        new names. --monitor may name one; return it alike on every process."""
        return {}

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        """After the epoch's validation, before its record is logged (metrics.jsonl) and its checkpoint
        written, which holds your `state_dict` as this method leaves it. `run.request_stop(reason)` ends
        the run here; from other hooks, at the next --log-every updates."""

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        """After the final test, with the summary that train.py writes to summary.json."""

    def state_dict(self) -> dict[str, Any]:
        """What your hooks keep, as JSON values (numbers, strings, lists, dicts), saved in every
        checkpoint so --resume can restore it."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, on every process, when --resume continues a run."""
