"""Speed and memory of a GPU run, for the steps.jsonl records. Managed by the looptpl template.

Every --log-every updates the loop waits for the GPU anyway (to check the loss), so the host
clock then measures the updates since the previous record exactly. Figures are for the whole
run (all ranks); peak memory is this rank's. MFU (model FLOP utilization) needs the FLOPs of one
training sample from model.py's optional `flops_per_sample(config)` and a GPU whose peak rate is
listed below.
"""

import time
from collections.abc import Callable
from typing import Any

import torch

from .config import TrainConfig

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
    """Measures the stretch of updates between two log records; inactive on the CPU."""

    def __init__(
        self,
        config: TrainConfig,
        device: torch.device,
        world_size: int,
        flops_per_sample: Callable[[TrainConfig], float] | None,
    ) -> None:
        self.device = device
        self.active = device.type == "cuda"
        peak = peak_flops(config, device) if self.active else None
        self.flops_share = flops_per_sample(config) / (peak * world_size) if flops_per_sample and peak else None
        self.restart()

    def restart(self) -> None:
        """Start a new stretch (after a record, an evaluation, or at an epoch's start)."""
        if self.active:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.started = time.perf_counter()

    def figures(self, samples: int, units: float, per: str) -> dict[str, Any]:
        """Samples/s (and `per`s/s, e.g. tokens, when the loss is weighted by them), peak memory, MFU.

        Call it only right after the GPU was waited for, else the clock measures the host alone.
        """
        if not self.active:
            return {}
        seconds = max(time.perf_counter() - self.started, 1e-9)
        figures: dict[str, Any] = {"samples_per_s": round(samples / seconds, 1)}
        if per != "sample":
            figures[f"{per}s_per_s"] = round(units / seconds, 1)
        figures["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 3)
        if self.flops_share is not None:
            figures["mfu"] = round(samples / seconds * self.flops_share, 4)
        return figures
