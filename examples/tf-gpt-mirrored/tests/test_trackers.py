"""--tracker: Weights & Biases and MLflow get every record, offline, and a resumed run continues
the same tracker run. The metric logger is driven here directly, as the loop drives it."""

import errno
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from gpt_mirrored.kit.config import parse_config
from gpt_mirrored.kit.errors import ConfigError, RunError
from gpt_mirrored.kit.logs import MetricLogger
from gpt_mirrored.kit.trackers import open_tracker

STEP_RECORD = {"epoch": 1, "step": 10, "train_loss": 1.25, "lr": 0.002}
EPOCH_1 = {"epoch": 1, "train_loss": 1.0, "val_loss": 0.75, "step": 16, "lr": 0.001, "epoch_time_s": 0.5}
EPOCH_2 = {"epoch": 2, "train_loss": 0.5, "val_loss": 0.25, "step": 32, "lr": 0.0, "epoch_time_s": 0.5}
SUMMARY = {"epochs_run": 2, "steps": 32, "stopped_early": False, "tested_checkpoint": "last", "test_loss": 0.3}


def log_a_run_stopped_and_resumed(run_dir: Path, tracker: str, stopped: Any = None) -> None:
    """Epoch 1 in one process, which stops (`stopped()` stands for its exit); epoch 2 after --resume."""
    config = parse_config(["--tracker", tracker, "--run-dir", str(run_dir)])
    run_dir.mkdir(parents=True, exist_ok=True)
    first = MetricLogger(run_dir, config)
    first.log_step(STEP_RECORD)
    first.log(EPOCH_1)
    if stopped is not None:
        stopped(first)
    resumed = MetricLogger(run_dir, config)
    resumed.log(EPOCH_2)
    resumed.close(SUMMARY)


class FakeWandb(types.ModuleType):
    """Stands for the wandb package: records what the logger asks of it."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # "installed", for importlib.util.find_spec
        self.calls: list[tuple[str, Any]] = []

    def init(self, **settings: Any) -> "FakeWandb":
        self.calls.append(("init", settings))
        self.summary = types.SimpleNamespace(update=lambda values: self.calls.append(("summary", values)))
        return self

    def log(self, values: dict[str, float], step: int) -> None:
        self.calls.append(("log", (values, step)))

    def finish(self) -> None:
        self.calls.append(("finish", None))


def test_wandb_gets_every_record_against_the_step_and_a_resumed_run_continues_it(tmp_path, monkeypatch):
    wandb = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    log_a_run_stopped_and_resumed(tmp_path / "run", "wandb")
    inits = [settings for call, settings in wandb.calls if call == "init"]
    assert len(inits) == 2 and inits[0]["id"] == inits[1]["id"] and inits[0]["resume"] == "allow"
    assert inits[0]["project"] == "gpt_mirrored" and inits[0]["config"]["tracker"] == "wandb"
    assert [settings for call, settings in wandb.calls if call == "log"] == [
        ({"steps/epoch": 1, "steps/train_loss": 1.25, "steps/lr": 0.002}, 10),
        ({"epoch": 1, "train_loss": 1.0, "val_loss": 0.75, "lr": 0.001, "epoch_time_s": 0.5}, 16),
        ({"epoch": 2, "train_loss": 0.5, "val_loss": 0.25, "lr": 0.0, "epoch_time_s": 0.5}, 32),
    ]
    assert wandb.calls[-2:] == [("summary", {"epochs_run": 2, "steps": 32, "test_loss": 0.3}), ("finish", None)]


def test_a_tracker_that_cannot_start_is_one_line(tmp_path, monkeypatch):
    wandb = FakeWandb()
    wandb.init = lambda **settings: (_ for _ in ()).throw(RuntimeError("api_key not configured (no-tty)\nmore"))
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    with pytest.raises(ConfigError, match=r"could not start \(api_key not configured \(no-tty\)\); run `wandb login`"):
        MetricLogger(tmp_path, parse_config(["--tracker", "wandb"]))


def test_a_tracker_without_its_package_is_refused_before_the_run(monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "mlflow" else find_spec(name))
    with pytest.raises(SystemExit):
        parse_config(["--tracker", "mlflow"])
    assert '--tracker mlflow needs the mlflow package: pip install -e ".[mlflow]"' in capsys.readouterr().err


def test_a_damaged_tracker_json_is_named_not_blamed_on_the_tracker(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", FakeWandb())
    (tmp_path / "tracker.json").write_text('{"wandb": "0123')  # cut short
    with pytest.raises(RunError) as error:
        open_tracker("wandb", tmp_path, "gpt_mirrored", {})
    assert str(error.value).startswith(f"{tmp_path / 'tracker.json'} is damaged (not a JSON object of run ids)")


def test_tracker_json_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """A disk that fills up while tracker.json is written leaves the file as it was."""
    monkeypatch.setitem(sys.modules, "wandb", FakeWandb())
    saved = '{"mlflow": "0123"}\n'
    (tmp_path / "tracker.json").write_text(saved)
    write_text = Path.write_text

    def half_then_full(path: Path, text: str, *args: Any, **kwargs: Any) -> int:
        write_text(path, text[: len(text) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(RunError):
        open_tracker("wandb", tmp_path, "gpt_mirrored", {})
    monkeypatch.undo()
    assert (tmp_path / "tracker.json").read_text() == saved


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason='needs mlflow: pip install -e ".[mlflow]"')
def test_an_unreachable_mlflow_server_fails_within_seconds_naming_it(tmp_path, monkeypatch):
    # This machine's discard port, where nothing listens; MLflow alone would retry it for about 4 minutes.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    errors: list[str] = []

    def start() -> None:
        try:
            open_tracker("mlflow", tmp_path, "gpt_mirrored", {})
        except ConfigError as error:
            errors.append(str(error))

    attempt = threading.Thread(target=start, daemon=True)  # left behind if it still retries
    attempt.start()
    attempt.join(timeout=30)
    assert errors, "--tracker mlflow still tries http://127.0.0.1:9 after 30 s"
    assert errors[0].startswith("--tracker mlflow cannot use the server at MLFLOW_TRACKING_URI=http://127.0.0.1:9 (")
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the quick check's settings are gone again


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason='needs wandb: pip install -e ".[wandb]"')
def test_wandb_runs_offline_and_a_resumed_run_keeps_its_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_a_run_stopped_and_resumed(tmp_path / "run", "wandb", stopped=lambda logger: logger.tracker.run.finish())
    run_id = (tmp_path / "run" / "tracker.json").read_text().split('"')[3]
    runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*"))
    # offline-run-<time>-<id>, with "-1" added when both started in the same second.
    assert len(runs) == 2 and all(f"-{run_id}" in run.name for run in runs)
    assert all(next(run.glob(f"run-{run_id}*.wandb")).stat().st_size > 0 for run in runs)


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason='needs mlflow: pip install -e ".[mlflow]"')
def test_mlflow_logs_into_the_run_directory_and_a_resumed_run_continues_it(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run"
    log_a_run_stopped_and_resumed(run_dir, "mlflow", stopped=lambda logger: mlflow.end_run())
    client = mlflow.MlflowClient(f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
    [run] = client.search_runs([client.get_experiment_by_name("gpt_mirrored").experiment_id])
    history = {
        name: [(metric.step, metric.value) for metric in client.get_metric_history(run.info.run_id, name)]
        for name in run.data.metrics
    }
    assert history["val_loss"] == [(16, 0.75), (32, 0.25)]
    assert history["steps/train_loss"] == [(10, 1.25)]
    assert history["test_loss"] == [(32, 0.3)]
    assert run.data.params["tracker"] == "mlflow" and run.info.status == "FINISHED"
