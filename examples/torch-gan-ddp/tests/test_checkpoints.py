"""What the loop writes is read back exactly or refused: checkpoints carry a checksum of their content,
the logs are rewritten in one rename on resume. A checkpoint written in the background
(--async-checkpoints) holds the state it was taken with, however far training has gone on meanwhile.

Runs that resume from damaged checkpoints are in test_training.py and test_distributed.py.
"""

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from gan_ddp import distributed, files, logs
from gan_ddp.kit.checkpoint import FORMAT, HOLDS, Checkpointer, check_format, load_whole
from gan_ddp.kit.config import parse_config
from gan_ddp.kit.contract import template_version
from gan_ddp.kit.errors import CheckpointError


def test_a_checkpoint_reads_back_exactly_or_is_refused(tmp_path):
    payload = {"model": {"weight": torch.randn(64, 64), "half": torch.ones(3, dtype=torch.bfloat16)}, "epoch": 2}
    path = tmp_path / "epoch-0002.pt"
    files.save(payload, path)
    read = files.load(path)
    assert read.keys() == payload.keys() and read["epoch"] == 2
    assert all(torch.equal(read["model"][name], value) for name, value in payload["model"].items())
    whole = path.read_bytes()
    flipped = bytearray(whole)
    flipped[len(whole) // 2] ^= 0x10  # inside the weights: torch.load itself reads it without complaint
    path.write_bytes(bytes(flipped))
    assert not torch.equal(torch.load(path, weights_only=True)["model"]["weight"], payload["model"]["weight"])
    with pytest.raises(CheckpointError, match=r"epoch-0002\.pt is damaged"):
        files.load(path)
    path.write_bytes(whole[: len(whole) // 2])  # cut short
    with pytest.raises((RuntimeError, OSError)):  # torch's own errors, for a file cut short
        files.load(path)


def test_resume_rewrites_the_logs_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    logger = logs.MetricLogger(tmp_path, parse_config(["--run-dir", str(tmp_path), "--device", "cpu"]))
    for epoch in (1, 2, 3):
        logger.log({"epoch": epoch, "train_loss": 1.0 / epoch, "step": 10 * epoch})
        logger.log_step({"epoch": epoch, "step": 10 * epoch, "train_loss": 1.0 / epoch})
    logged = (tmp_path / "metrics.jsonl").read_text()
    # A crash while the logs are rewritten (here, at the second record) leaves them as they were.
    dumps, calls = json.dumps, []

    def crash_at_the_second(record: Any) -> str:
        calls.append(record)
        if len(calls) == 2:
            raise OSError("killed")
        return dumps(record)

    monkeypatch.setattr(logs.json, "dumps", crash_at_the_second)
    with pytest.raises(OSError, match="killed"):
        logger.keep_until(2, 20)
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text() == logged and not list(tmp_path.glob("*.tmp"))
    # A last line cut short (a kill while appending) is dropped, with a warning.
    with (tmp_path / "steps.jsonl").open("a") as steps:
        steps.write('{"epoch": 4, "st')
    assert logger.keep_until(2, 20) == ""
    assert "steps.jsonl: dropped its last line, cut short" in capsys.readouterr().out
    assert [json.loads(line)["epoch"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0] == "epoch,train_loss,step"
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 2
    # A damaged line elsewhere is named, and nothing is rewritten.
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\nnot json\n{"epoch": 2}\n')
    assert logger.keep_until(2, 20).startswith(f"{tmp_path / 'metrics.jsonl'}:2 is damaged")
    assert (tmp_path / "metrics.jsonl").read_text() == '{"epoch": 1}\nnot json\n{"epoch": 2}\n'


def test_a_checkpoint_written_in_the_background_holds_the_weights_it_was_taken_with(tmp_path, monkeypatch):
    config = parse_config(["--device", "cpu", "--run-dir", str(tmp_path), "--async-checkpoints"])
    runtime = distributed.setup(config)
    try:
        model = torch.nn.Linear(3, 2)
        checkpointer = Checkpointer(tmp_path, runtime, config, model, [torch.optim.AdamW(model.parameters())], None)
        # The file is written only once training has changed the weights.
        trained_on = threading.Event()
        save = files.save

        def save_after_the_update(payload: dict[str, Any], path: Path) -> None:
            trained_on.wait(timeout=30)
            save(payload, path)

        monkeypatch.setattr(files, "save", save_after_the_update)
        taken = {name: value.clone() for name, value in model.state_dict().items()}
        checkpointer.save({"epoch": 1}, "epoch-0001", is_best=True)
        assert not (tmp_path / "checkpoints" / "epoch-0001.pt").exists()  # still being written
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)
        trained_on.set()
        checkpointer.finish()
        for name in ("epoch-0001.pt", "best.pt"):
            written = load_whole(tmp_path / "checkpoints" / name)["model"]
            for key, value in taken.items():
                torch.testing.assert_close(written[key], value, atol=0, rtol=0, msg=f"{name}: {key}")
    finally:
        distributed.teardown(wait_for_others=False)


def test_a_checkpoint_this_loop_cannot_continue_is_refused_naming_the_template_version_that_wrote_it(tmp_path):
    config = parse_config(["--device", "cpu", "--run-dir", str(tmp_path)])
    runtime = distributed.setup(config)
    try:
        model = torch.nn.Linear(3, 2)
        checkpointer = Checkpointer(tmp_path, runtime, config, model, [torch.optim.AdamW(model.parameters())], None)
        checkpointer.save({"epoch": 1}, "epoch-0001", is_best=False)
        checkpointer.finish()
    finally:
        distributed.teardown(wait_for_others=False)
    path = tmp_path / "checkpoints" / "epoch-0001.pt"
    written = files.load(path)
    assert written["format"] == FORMAT and written["template"] == template_version()
    answers = (Path(__file__).parents[1] / ".copier-answers.yml").read_text()
    # YAML quotes a commit that reads as a number ('6268204'): compare without the quotes.
    assert template_version() is None or f"_commit: {template_version()}" in answers.replace("'", "")

    complete = {**dict.fromkeys(HOLDS), "format": FORMAT, "template": "0123abc"}
    check_format(path, complete)  # this loop's own format: nothing to say
    newer = {**complete, "format": FORMAT + 1}
    with pytest.raises(CheckpointError, match=rf"written by template version 0123abc \(checkpoint format {FORMAT + 1}"):
        check_format(path, newer)
    lacking = {key: value for key, value in complete.items() if key != "schedulers"}
    with pytest.raises(CheckpointError, match=r"written by template version 0123abc \(it holds no schedulers\)"):
        check_format(path, lacking)
    del lacking["template"]  # written before checkpoints recorded the version
    with pytest.raises(CheckpointError, match=r"written by an older version of the template \(it holds no schedulers"):
        check_format(path, lacking)
