"""--profile: a trace of a few updates with torch's profiler. Managed by the looptpl template.

Updates 1 and 2 of the run (or of a resumed run) are left alone (start-up, allocation), update 3
warms the profiler up, and updates 4 to 6 are recorded, data loading included, with tensor shapes
and memory. Each rank writes `profile/rank<R>.*.pt.trace.json` in the run directory, for
TensorBoard (`pip install torch-tb-profiler`, then `tensorboard --logdir <run-dir>/profile`),
https://ui.perfetto.dev or chrome://tracing, and rank 0 prints the most expensive operations.
"""

from pathlib import Path

from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from ..distributed import Runtime

SKIPPED, WARMUP, RECORDED = 2, 1, 3


class UpdateProfiler:
    """Call `step()` after every update; it profiles the few described above, then stops."""

    def __init__(self, enabled: bool, run_dir: Path, runtime: Runtime) -> None:
        self.directory = run_dir / "profile"
        self.runtime = runtime
        self.profiler: profile | None = None
        if not enabled:
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runtime.device.type == "cuda" else [])
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=SKIPPED, warmup=WARMUP, active=RECORDED, repeat=1),
            on_trace_ready=tensorboard_trace_handler(str(self.directory), worker_name=f"rank{runtime.rank}"),
            record_shapes=True,
            profile_memory=True,
        )
        self.profiler.start()
        self.updates = 0

    def step(self) -> None:
        if self.profiler is None:
            return
        self.profiler.step()
        self.updates += 1
        if self.updates == SKIPPED + WARMUP + RECORDED:
            self.stop()

    def stop(self) -> None:
        """End profiling now (a run shorter than the window ends it early)."""
        if self.profiler is None:
            return
        profiler, self.profiler = self.profiler, None
        profiler.stop()
        if self.runtime.is_main and self.updates > SKIPPED + WARMUP:
            sort_by = "self_cuda_time_total" if self.runtime.device.type == "cuda" else "self_cpu_time_total"
            print(profiler.key_averages().table(sort_by=sort_by, row_limit=12), flush=True)
            print(f"profile of {RECORDED} updates written to {self.directory}", flush=True)
