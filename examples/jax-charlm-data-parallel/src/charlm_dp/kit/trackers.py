"""Experiment trackers for --tracker: Weights & Biases or MLflow. Managed by the looptpl template.

Only the process that logs (rank 0, the chief) opens one, and neither needs a network:

- wandb (`pip install -e ".[wandb]"`): `wandb login` once to upload as the run goes, or set
  WANDB_MODE=offline to keep the run in <run-dir>/wandb and upload it later with `wandb sync`.
- mlflow (`pip install -e ".[mlflow]"`): to the server in MLFLOW_TRACKING_URI (one that does not
  answer stops the run within seconds), or by default to the SQLite file <run-dir>/mlflow.db
  (`mlflow ui --backend-store-uri sqlite:///<run-dir>/mlflow.db`).

The epoch records are logged under their names (val_loss), the records of every --log-every
updates under steps/ (steps/train_loss), both against the update count, as in TensorBoard. A
resumed run continues the same tracker run: its id is kept in <run-dir>/tracker.json. Updates
trained again after a resume are logged again: W&B keeps the first value of a step, MLflow both.
"""

import contextlib
import importlib.util
import json
import logging
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import TrackerError

TRACKERS = ("wandb", "mlflow")


def missing_package(tracker: str) -> str:
    """Why `tracker` cannot run here, in words, or "" when it can."""
    if tracker in TRACKERS and importlib.util.find_spec(tracker) is None:
        return f'--tracker {tracker} needs the {tracker} package: pip install -e ".[{tracker}]"'
    return ""


class Tracker:
    """What the metric logger calls. This one tracks nothing (--tracker none)."""

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any]) -> None:
        """Start (or, after --resume, continue) the run in `run_dir`, in `project`, with its `config`."""

    def log(self, values: dict[str, float], step: int) -> None:
        """Log numbers against the update count."""

    def close(self, results: dict[str, float]) -> None:
        """Finish the run with its final results (the test's), uploading what is left."""


def open_tracker(tracker: str, run_dir: Path, project: str, config: dict[str, Any]) -> Tracker:
    """The tracker named by --tracker, logging into `project`, for the run in `run_dir`."""
    opened = {"wandb": WandbTracker, "mlflow": MlflowTracker}.get(tracker, Tracker)
    try:
        return opened(run_dir, project, config)
    except TrackerError:  # tracker.json, or a server out of reach: named already
        raise
    except Exception as error:  # not logged in, ...
        advice = "run `wandb login`, or set WANDB_MODE=offline" if tracker == "wandb" else "check MLFLOW_TRACKING_URI"
        raise TrackerError(f"--tracker {tracker} could not start ({_first_line(error)}); {advice}") from None


class WandbTracker(Tracker):
    def __init__(self, run_dir: Path, project: str, config: dict[str, Any]) -> None:
        import wandb

        run_id = _saved_id(run_dir, "wandb") or uuid.uuid4().hex[:16]
        self.run = wandb.init(
            project=project, name=run_dir.resolve().name, id=run_id, resume="allow", dir=str(run_dir), config=config
        )
        _save_id(run_dir, "wandb", run_id)

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self, results: dict[str, float]) -> None:
        self.run.summary.update(results)
        self.run.finish()


class MlflowTracker(Tracker):
    def __init__(self, run_dir: Path, project: str, config: dict[str, Any]) -> None:
        import mlflow

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # not its database set-up messages
        local = "MLFLOW_TRACKING_URI" not in os.environ
        if local:
            mlflow.set_tracking_uri(f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
        try:
            with _without_retries():  # the first request: a server out of reach fails here, in seconds
                experiment = mlflow.get_experiment_by_name(project)
        except mlflow.MlflowException as error:
            if local:
                raise
            raise TrackerError(
                f"--tracker mlflow cannot use the server at MLFLOW_TRACKING_URI={mlflow.get_tracking_uri()} "
                f"({_reason(error)}); start it or correct the URI, or unset MLFLOW_TRACKING_URI to log into "
                f"{run_dir / 'mlflow.db'}"
            ) from None
        if experiment is None:
            artifacts = (run_dir / "mlartifacts").resolve().as_uri() if local else None
            experiment_id = mlflow.create_experiment(project, artifact_location=artifacts)
        else:
            experiment_id = experiment.experiment_id
        run_id = _saved_id(run_dir, "mlflow")
        self.run = mlflow.start_run(run_id=run_id, experiment_id=experiment_id, run_name=run_dir.resolve().name)
        if run_id is None:
            # MLflow keeps a parameter's first value: log the config once, as the run started.
            mlflow.log_params({name: str(value)[:6000] for name, value in config.items()})
            _save_id(run_dir, "mlflow", self.run.info.run_id)
        self.mlflow = mlflow

    def log(self, values: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(values, step=step)

    def close(self, results: dict[str, float]) -> None:
        self.mlflow.log_metrics(results, step=int(results.get("steps", 0)))
        self.mlflow.end_run()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def _without_retries() -> Iterator[None]:
    """MLflow retries a server out of reach for about four minutes: inside this block it tries once,
    waiting at most 10 seconds (unless you set MLflow's variables yourself); outside, it retries as usual."""
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    unset = [name for name in quick if name not in os.environ]
    os.environ.update({name: quick[name] for name in unset})
    try:
        yield
    finally:
        for name in unset:
            os.environ.pop(name, None)


def _reason(error: BaseException) -> str:
    """Why a request failed, in a few words: the system's (Connection refused), else the first line."""
    text = str(error)
    if found := re.search(r"\[Errno -?\d+\] ([^\"'()]+)", text):
        return found[1].strip()
    return "timed out" if "timed out" in text else _first_line(error)[:200]


def _saved_ids(run_dir: Path) -> dict[str, str]:
    """The tracker run ids kept in <run-dir>/tracker.json, by tracker; none before the first run."""
    path = run_dir / "tracker.json"
    if not path.exists():
        return {}
    try:
        saved = json.loads(path.read_text())
    except ValueError:  # cut short, or not text at all
        saved = None
    if not isinstance(saved, dict) or not all(isinstance(run_id, str) for run_id in saved.values()):
        raise TrackerError(
            f"{path} is damaged (not a JSON object of run ids); it lets --resume continue the tracker's run: "
            "restore it, or delete it to log the rest of this run as a new tracker run"
        )
    return saved


def _saved_id(run_dir: Path, tracker: str) -> str | None:
    return _saved_ids(run_dir).get(tracker)


def _save_id(run_dir: Path, tracker: str, run_id: str) -> None:
    path = run_dir / "tracker.json"
    written = path.with_name(f"{path.name}.tmp")
    try:
        written.write_text(json.dumps({**_saved_ids(run_dir), tracker: run_id}) + "\n")
        written.replace(path)  # whole or not at all: a crash while writing leaves the old file as it was
    except OSError as error:
        written.unlink(missing_ok=True)
        raise TrackerError(
            f"cannot write {path} ({error.strerror}); free some space or choose another --run-dir"
        ) from None
