"""--profile: a trace of a few calls of the train step, with TensorFlow's profiler.

Managed by the looptpl template.

The first call of the run (or of a resumed run) traces and compiles the step and is left alone;
calls 2 to 4 are recorded (each of up to --steps-per-call updates), input pipeline included. Each
worker writes `profile/worker<W>/plugins/profile/<time>/*.xplane.pb` in the run directory, for
TensorBoard's profiler (`pip install tensorboard-plugin-profile`, then `tensorboard --logdir
<run-dir>/profile`).
"""

from pathlib import Path

import tensorflow as tf

from ..distributed import Runtime

SKIPPED, RECORDED = 1, 3


class CallProfiler:
    """Call `step()` after every call of the train step; it profiles the few described above, then stops."""

    def __init__(self, enabled: bool, run_dir: Path, runtime: Runtime) -> None:
        self.enabled = enabled
        self.directory = run_dir / "profile" / f"worker{runtime.task_id}"
        self.is_main = runtime.is_main
        self.calls = 0

    def step(self) -> None:
        if not self.enabled:
            return
        self.calls += 1
        if self.calls == SKIPPED:
            tf.profiler.experimental.start(str(self.directory))
        elif self.calls == SKIPPED + RECORDED:
            tf.profiler.experimental.stop()
            self.enabled = False
            if self.is_main:
                print(f"profile of {RECORDED} calls of the train step written to {self.directory}", flush=True)
