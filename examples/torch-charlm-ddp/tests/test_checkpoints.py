"""A checkpoint written in the background (--async-checkpoints) holds the state it was taken with,
however far training has gone on meanwhile, and is completed like any other.

Runs that stop and resume with it are in test_distributed.py (two ranks; sharded under FSDP).
"""

import threading
from pathlib import Path
from typing import Any

import torch

from charlm_ddp import distributed, files
from charlm_ddp.checkpoint import Checkpointer, load_whole
from charlm_ddp.config import parse_config


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
