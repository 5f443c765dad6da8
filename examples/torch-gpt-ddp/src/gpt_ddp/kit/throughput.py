"""Speed of the updates, and memory on a GPU, for the steps.jsonl records. Managed by the looptpl template.

Every --log-every updates the loop waits for the device anyway (to check the loss), so the host
clock then measures the updates since the previous record exactly. Speeds are for the whole run
(all ranks); peak memory is this rank's. MFU (model FLOP utilization) needs the FLOPs of one
training sample from model.py's optional `flops_per_sample(config)` and a GPU whose peak rate is
listed below.
"""

from collections.abc import Callable
from typing import Any

import torch

from .config import TrainConfig
from .logs import UpdateSpeed

# Dense tensor-core peaks in TFLOP/s from the vendors' datasheets: (bf16 and fp16, TF32), by a part of the name.
PEAK_TFLOPS = {
    "B200": (2250.0, 1100.0),
    "H200": (989.0, 494.0),
    "H100 PCIe": (756.0, 378.0),
    "H100": (989.0, 494.0),
    "A100": (312.0, 156.0),
    "L40S": (362.0, 183.0),
    "L4": (121.0, 60.0),
}


def peak_flops(config: TrainConfig, device: torch.device) -> float | None:
    """The device's peak FLOP/s at --precision, if it is listed; none for full float32 (--no-tf32)."""
    name = torch.cuda.get_device_name(device)
    peaks = next((peaks for part, peaks in PEAK_TFLOPS.items() if part in name), None)
    if peaks is None or (config.precision == "fp32" and not config.tf32):
        return None
    return 1e12 * (peaks[1] if config.precision == "fp32" else peaks[0])


class Throughput:
    """Measures the stretch of updates between two log records: its speed on any device, memory on a GPU."""

    def __init__(
        self,
        config: TrainConfig,
        device: torch.device,
        world_size: int,
        flops_per_sample: Callable[[TrainConfig], float] | None,
    ) -> None:
        self.device = device
        self.on_gpu = device.type == "cuda"
        peak = peak_flops(config, device) if self.on_gpu else None
        self.flops_share = flops_per_sample(config) / (peak * world_size) if flops_per_sample and peak else None
        self.speed = UpdateSpeed()
        self.restart(0)

    def restart(self, done: int) -> None:
        """Start a new stretch after update `done` of the epoch (a record, an evaluation, the epoch's start)."""
        if self.on_gpu:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.speed.restart(done, 0)  # the loop counts a stretch's samples from 0

    def figures(self, done: int, samples: int, units: float, per: str) -> dict[str, Any]:
        """Time per update and samples/s (and `per`s/s, e.g. tokens, when the loss is weighted by them)
        from the stretch that ends after update `done`; on a GPU, peak memory and MFU.

        Call it only right after the device was waited for, else the clock measures the host alone.
        """
        figures: dict[str, Any] = self.speed.figures(done, samples)
        seconds = self.speed.seconds
        if per != "sample":
            figures[f"{per}s_per_s"] = round(units / seconds, 1)
        if not self.on_gpu:
            return figures
        figures["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 3)
        if self.flops_share is not None:
            figures["mfu"] = round(samples / seconds * self.flops_share, 4)
        return figures
