"""Checks that need a CUDA GPU; skipped without one.

A GPU runs ahead of Python: while it computes one update, the host prepares the next batch and
queues the next kernels. Anything that reads a value back (`.item()`, `print(loss)`, a tensor
built on the host and copied over) makes the host wait until the GPU is idle, and the GPU then
waits for the host. The loop reads values back only every --log-every updates.
"""

import pytest
import torch

from gpt_ddp import distributed
from gpt_ddp.data import build_datasets
from gpt_ddp.kit.config import parse_config
from gpt_ddp.model import build_model
from gpt_ddp.train import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_updates_never_wait_for_the_gpu(tmp_path):
    # Your step.py, model.py and loss.py run here too: a sync in them fails this test, naming the call.
    config = parse_config(["--device", "cuda", "--run-dir", str(tmp_path), "--no-progress", "--precision", "bf16"])
    runtime = distributed.setup(config)
    try:
        trainer = Trainer(config, runtime, build_model(config), build_datasets(config))
        trainer.set_training(True)
        batches = trainer.loaders.start_epoch(0, 0)

        def update() -> None:
            micro_batches, _ = trainer.loaders.next_update(batches, 0)
            trainer.update(micro_batches, "the test")

        update()  # the first one allocates, picks kernels and creates the optimizer state
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any synchronizing call now raises, naming itself
        try:
            for _ in range(3):
                update()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    finally:
        distributed.teardown(wait_for_others=False)
