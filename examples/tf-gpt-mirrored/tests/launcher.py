"""How the tests start a training run of this project's strategy, mirrored: one process, with its
replicas on logical CPU devices.

TRAIN_FLAGS (project.py) gives 1007 training samples = 25 global batches of 40 + a last one of 7:
on 2 replicas (20 samples each) it splits 3 + 4, and with --grad-accum-steps 2 into micro-batches
of 1, 2, 2 and 2. 251 validation samples in batches of 100 per replica: the last step gives 51 to
replica 0 and none to replica 1.
"""

import sys
from pathlib import Path

# A process: its command, and the environment variables it gets beside the tests' own.
Process = tuple[list[str], dict[str, str]]


def processes(run_dir: Path, *flags: str, replicas: int = 1) -> list[Process]:
    """The one process that trains into `run_dir`, with `replicas` replicas on logical CPU devices."""
    module = ["-m", "gpt_mirrored.train", "--run-dir", str(run_dir), "--no-progress"]
    return [([sys.executable, *module, "--cpu-replicas", str(replicas), *flags], {})]
