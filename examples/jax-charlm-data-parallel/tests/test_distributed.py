"""N devices train like one: 2 CPU devices, 2 micro-steps each, and 2 processes of one device, at the same
global batch, end with the figures of one device (dropout included: each sample draws its own mask). A run
checkpointed on 2 devices goes on exactly on one."""

from pathlib import Path

import pytest
from test_training import evaluated_samples, records, train


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for name, flags in {
        "one": ("--cpu-devices", "1"),
        "two": ("--cpu-devices", "2"),
        "accumulated": ("--cpu-devices", "2", "--grad-accum-steps", "2"),
    }.items():
        done = train(root / name, *flags)
        assert done.returncode == 0, done.stderr[-3000:]
        (root / name / "output.txt").write_text(done.stdout)
    done = train(root / "processes", "--cpu-devices", "1", processes=2)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.mark.parametrize("other", ["two", "accumulated", "processes"])
def test_two_devices_accumulation_and_two_processes_train_like_one_device(runs: Path, other: str) -> None:
    one, two = records(runs / "one"), records(runs / other)
    for first, second in zip(one, two, strict=True):
        for name in ("train_loss", "val_loss", "val_accuracy"):
            assert second[name] == pytest.approx(first[name], rel=1e-5), name
    assert one[-1]["val_samples"] == evaluated_samples("val")  # every validation sample once, the padding left out


def test_a_run_checkpointed_on_two_devices_goes_on_exactly_on_one(runs: Path, tmp_path: Path) -> None:
    # Orbax reads each array back as the new mesh places it: the run cannot tell it moved.
    stopped = train(tmp_path / "run", "--cpu-devices", "2", "--stop-after-step", "5")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    resumed = train(tmp_path / "run", "--cpu-devices", "1", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for first, second in zip(records(runs / "one"), records(tmp_path / "run"), strict=True):
        for name in ("train_loss", "val_loss"):
            assert second[name] == pytest.approx(first[name], rel=1e-5), name
