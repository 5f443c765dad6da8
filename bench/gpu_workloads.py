"""The models and synthetic data of bench/gpu_loop.py: a GPT-style language model and a CNN.

Every loop of the benchmark trains the same model from the same initial weights on the same
data with the same math: mean cross-entropy over tokens (GPT) or samples (CNN), AdamW with
--lr and --weight-decay, the global gradient norm clipped to 1.0, a warmup + cosine schedule.
Imports torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset


@dataclass(frozen=True)
class Shape:
    """A workload's size: GPT fields, or CNN fields (`image`, `classes`, `channels`)."""

    kind: str  # "gpt" or "cnn"
    batch: int  # global batch, in samples (sequences or images)
    vocab: int = 0
    width: int = 0
    depth: int = 0
    heads: int = 0
    context: int = 0
    image: int = 0
    classes: int = 0
    channels: tuple[int, ...] = ()


PRESETS = {
    # The GPT of issue #14's measurements: 8 layers x 512, vocab 8192, 256 tokens, 64 sequences (~30M weights).
    "gpt30m": Shape("gpt", batch=64, vocab=8192, width=512, depth=8, heads=8, context=256),
    # GPT-2 small's shape (~124M weights), for the MFU figure.
    "gpt125m": Shape("gpt", batch=16, vocab=50304, width=768, depth=12, heads=12, context=1024),
    # A VGG-style CNN on 32x32 images (~4.7M weights): convolutions, batch norm, a short step.
    "cnn": Shape("cnn", batch=256, image=32, classes=10, channels=(64, 128, 256, 512)),
    # Seconds on a CPU: for checking that every loop runs, not for timing.
    "tiny": Shape("gpt", batch=8, vocab=64, width=32, depth=2, heads=2, context=16),
    "tiny-cnn": Shape("cnn", batch=8, image=8, classes=4, channels=(8, 16)),
}


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (SDPA) and a GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, -1).transpose(1, 3).unbind(2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    """Token and position embeddings, `depth` blocks, a head tied to the token embedding."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.tokens = nn.Embedding(shape.vocab, shape.width)
        self.positions = nn.Embedding(shape.context, shape.width)
        self.blocks = nn.ModuleList(Block(shape.width, shape.heads) for _ in range(shape.depth))
        self.norm = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, shape.vocab, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class CNN(nn.Module):
    """VGG-style stages (two 3x3 convolutions with batch norm, then 2x2 pooling), a linear classifier."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        stages, width = [], 3
        for channels in shape.channels:
            stages.append(
                nn.Sequential(
                    nn.Conv2d(width, channels, 3, padding=1, bias=False),
                    nn.BatchNorm2d(channels),
                    nn.ReLU(inplace=True),
                    nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                    nn.BatchNorm2d(channels),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(2),
                )
            )
            width = channels
        self.blocks = nn.ModuleList(stages)
        self.classify = nn.Linear(width, shape.classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            images = block(images)
        return self.classify(images.mean(dim=(2, 3)))


def build_model(shape: Shape, seed: int = 0) -> nn.Module:
    """The model on the CPU, from the seed every loop uses (the generated project's --seed 0 too)."""
    torch.manual_seed(seed)
    return GPT(shape) if shape.kind == "gpt" else CNN(shape)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """FSDP's units: the transformer blocks, or the CNN's stages."""
    return list(model.blocks)  # type: ignore[arg-type]


class Tokens(Dataset):
    """Random token sequences of `context + 1` tokens, as dicts (the shape of a Hugging Face dataset)."""

    def __init__(self, shape: Shape, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.rows = torch.randint(0, shape.vocab, (size, shape.context + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"tokens": self.rows[index]}


class Images(Dataset):
    """Random images with random labels: (image, label) pairs."""

    def __init__(self, shape: Shape, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(size, 3, shape.image, shape.image, generator=generator)
        self.labels = torch.randint(0, shape.classes, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


def build_dataset(shape: Shape, size: int, seed: int = 1) -> Dataset:
    return Tokens(shape, size, seed) if shape.kind == "gpt" else Images(shape, size, seed)


def losses(model: nn.Module, batch: object) -> torch.Tensor:
    """Unreduced cross-entropy: one value per token (GPT, dict batches) or per image."""
    if isinstance(batch, dict):
        tokens = batch["tokens"]
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    images, labels = batch  # type: ignore[misc]
    return F.cross_entropy(model(images), labels, reduction="none")


def units_per_sample(shape: Shape) -> int:
    """Tokens per sequence that count in the loss (GPT), or 1 (CNN)."""
    return shape.context if shape.kind == "gpt" else 1


def flops_per_sample(shape: Shape) -> float:
    """Training FLOPs of one sample: 3x the forward's matrix products, counted by torch's FlopCounterMode.

    (Backward costs twice the forward.) Attention is counted in full, as the usual 6N + 12LdT
    estimate of GPT training FLOPs does.
    """
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(shape)
    sample = build_dataset(shape, 1)[0]
    batch = {"tokens": sample["tokens"][None]} if isinstance(sample, dict) else (sample[0][None], sample[1][None])
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        losses(model, batch)
    return 3.0 * counter.get_total_flops()


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup: int = 20
) -> torch.optim.lr_scheduler.LambdaLR:
    """The template's default schedule (schedules.py), for the loops that are not the template."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total_steps - warmup))))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# Dense bf16/fp16 tensor-core peaks from the vendor's datasheets, TFLOP/s, by a part of the device name.
PEAK_TFLOPS = {"H200": 989.4, "H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H100": 989.4, "A100": 312.0, "L40S": 362.0}


def peak_tflops(device_name: str) -> float | None:
    """The datasheet's dense bf16 peak of a GPU, if it is one of the few known here."""
    return next((peak for part, peak in PEAK_TFLOPS.items() if part in device_name), None)
