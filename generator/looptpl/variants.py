"""The backends and strategies looptpl can generate, and what each is for."""

from dataclasses import dataclass

from looptpl.errors import LooptplError


@dataclass(frozen=True)
class Variant:
    """One backend/strategy pair."""

    backend: str
    strategy: str
    when: str
    launch: str  # how its project is launched, in general (N processes, PKG the package)
    first_run: str  # what `looptpl new` suggests running first: a short run on this machine's CPUs


VARIANTS = (
    Variant(
        "torch",
        "single",
        "One process on one CPU or GPU; the simplest loop.",
        "python -m PKG.train",
        "python -m PKG.train --epochs 3",
    ),
    Variant(
        "torch",
        "ddp",
        "DistributedDataParallel: one process per GPU, one or many nodes; the model fits on one GPU.",
        "torchrun --standalone --nproc-per-node N -m PKG.train",
        "torchrun --standalone --nproc-per-node 2 -m PKG.train --device cpu --epochs 3",
    ),
    Variant(
        "torch",
        "fsdp",
        "FSDP2: shards parameters, gradients and optimizer state; the model is too big for one GPU.",
        "torchrun --standalone --nproc-per-node N -m PKG.train",
        "torchrun --standalone --nproc-per-node 2 -m PKG.train --device cpu --epochs 3",
    ),
    Variant(
        "tensorflow",
        "one-device",
        "OneDeviceStrategy: one CPU or GPU.",
        "python -m PKG.train",
        "python -m PKG.train --epochs 3",
    ),
    Variant(
        "tensorflow",
        "mirrored",
        "MirroredStrategy: every GPU of one machine (or N logical CPU devices).",
        "python -m PKG.train [--cpu-replicas N]",
        "python -m PKG.train --cpu-replicas 2 --epochs 3",
    ),
    Variant(
        "tensorflow",
        "multi-worker",
        "MultiWorkerMirroredStrategy: several machines, each given TF_CONFIG.",
        "python -m PKG.kit.launch --workers N",
        "python -m PKG.kit.launch --workers 2 -- --epochs 3",
    ),
    Variant(
        "jax",
        "single",
        "One process on one device (CPU or GPU); the simplest JAX loop.",
        "python -m PKG.train",
        "python -m PKG.train --epochs 3",
    ),
    Variant(
        "jax",
        "data-parallel",
        "A mesh over every device of every process: batches sharded, weights replicated (or N CPU devices).",
        "python -m PKG.train [--cpu-devices N]",
        "python -m PKG.train --cpu-devices 2 --epochs 3",
    ),
    Variant(
        "jax",
        "fsdp",
        "The data-parallel mesh with the weights and optimizer state sharded over the devices too.",
        "python -m PKG.train [--cpu-devices N]",
        "python -m PKG.train --cpu-devices 2 --epochs 3",
    ),
)

BACKENDS = tuple(dict.fromkeys(variant.backend for variant in VARIANTS))


def strategies(backend: str) -> list[str]:
    """The backend's strategies, its default (the simplest) first, as copier.yml defaults it."""
    return [variant.strategy for variant in VARIANTS if variant.backend == backend]


def backend_of(strategy: str) -> str | None:
    """The first backend with this strategy (single: torch, as copier.yml defaults it), or None if unknown."""
    return next((variant.backend for variant in VARIANTS if variant.strategy == strategy), None)


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise LooptplError(f"--backend {backend} is not supported; choose one of: {', '.join(BACKENDS)}")


def find_variant(backend: str, strategy: str) -> Variant:
    """The variant for these flags, or an error that names the valid choices."""
    check_backend(backend)
    for variant in VARIANTS:
        if variant.backend == backend and variant.strategy == strategy:
            return variant
    owner = backend_of(strategy)
    problem = f"is a {owner} strategy" if owner else "is not a known strategy"
    raise LooptplError(
        f"--strategy {strategy} {problem}; with --backend {backend} choose one of: {', '.join(strategies(backend))}"
    )
