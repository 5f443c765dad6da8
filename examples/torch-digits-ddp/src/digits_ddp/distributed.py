"""Process group, DistributedDataParallel and collectives. Managed by the looptpl template: edit model.py instead.

torchrun starts one process per device and sets RANK, LOCAL_RANK and WORLD_SIZE. Launched with
plain `python`, the same code runs as a world of one. CUDA devices use NCCL; the CPU uses gloo.
"""

import contextlib
import datetime
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .kit.collect import Mean
from .kit.config import TrainConfig
from .kit.errors import ConfigError, StepError
from .kit.sampling import rank_share

if TYPE_CHECKING:
    from .kit.stages import Stage

# What the update multiplies the gradients by to make them the exact mean's; None where that is exactly 1.
Factor = torch.Tensor | float | None


@dataclass(frozen=True)
class Runtime:
    """Where this process runs and which rank it is."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # this process's rank on its machine

    @property
    def is_main(self) -> bool:
        """The rank that logs and writes files."""
        return self.rank == 0


def setup(config: TrainConfig) -> Runtime:
    """Join the process group and pick this rank's device.

    Launched with plain `python`, this is a world of one: the same code path, nothing to wait for.
    """
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was given but no CUDA device is visible; use --device cpu or auto")
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
        use_tf32(config.tf32)
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    # A rank that never reaches a collective makes the others fail after this long, not hang.
    timeout = datetime.timedelta(seconds=config.dist_timeout_s)
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        store=_rendezvous_store(rank, world_size, timeout),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if use_cuda else None,
    )
    return Runtime(device=device, rank=rank, world_size=world_size, local_rank=local_rank)


def use_tf32(enabled: bool) -> None:
    """Float32 matrix products and convolutions on TF32 tensor cores (--tf32), or in full float32."""
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled


def _rendezvous_store(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """Where the ranks exchange addresses when they connect.

    Launched with plain `python`, a world of one keeps it in memory. Under torchrun the agent hosts
    it; every restart (--max-restarts) gets fresh keys, or a restarted rank could read an address
    that a dead rank published in the failed attempt, and fail to connect.
    """
    if "MASTER_ADDR" not in os.environ:
        return dist.HashStore()
    under_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=rank == 0 and not under_agent,
        timeout=timeout,
    )
    return dist.PrefixStore(f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)


def teardown(wait_for_others: bool) -> None:
    """Leave the process group; train.py calls this on every exit path.

    After a normal finish every rank first waits for the others: tearing gloo down while a peer
    is still mid-exchange can abort that peer.
    """
    if dist.is_initialized():
        if wait_for_others:
            dist.barrier()
        dist.destroy_process_group()


def wrap_model(model: nn.Module, runtime: Runtime) -> nn.Module:
    """Move the model to this rank's device and wrap it in DDP.

    DDP broadcasts rank 0's weights at construction, then averages gradients over ranks in
    buckets that overlap with the backward pass. The gradients are views into those buckets
    (gradient_as_bucket_view): no copy in and out of them, and no second copy in memory. A world
    of one process has nothing to average, and trains its model unwrapped, as `single` does.
    """
    model = model.to(runtime.device)
    if runtime.world_size == 1:
        return model
    device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)
    TRAINABLE_WHEN_WRAPPED[wrapped] = trainable(model)
    return wrapped


# What each DDP model trained when it was wrapped: DDP synchronizes the gradients of those weights only.
TRAINABLE_WHEN_WRAPPED: "weakref.WeakKeyDictionary[nn.Module, set[int]]" = weakref.WeakKeyDictionary()


def trainable(model: nn.Module) -> set[int]:
    return {id(param) for param in model.parameters() if param.requires_grad}


def check_trainable(model: nn.Module) -> None:
    """Refuse a change of which weights train since DDP wrapped the model (a hook's requires_grad_):
    DDP would leave the newly trained ones unsynchronized, and each rank would train them its own way."""
    if isinstance(model, DistributedDataParallel) and trainable(model.module) != TRAINABLE_WHEN_WRAPPED[model]:
        raise StepError(
            "hooks.py changed which weights train (requires_grad) after DDP wrapped the model, which DDP cannot "
            "follow: give frozen weights a learning rate of 0 in optim.py's param groups instead, or use fsdp"
        )


@contextlib.contextmanager
def gradient_sync(models: list[nn.Module], enabled: bool) -> Iterator[None]:
    """Skip DDP's gradient all-reduce on accumulation micro-steps that do not update.

    Gradients then pile up locally; the all-reduce of the last micro-step carries them all.
    """
    with contextlib.ExitStack() as stack:
        for model in models if not enabled else []:
            if isinstance(model, DistributedDataParallel):  # a world of one wraps nothing
                stack.enter_context(model.no_sync())
        yield


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks, in place, and return it. Every rank must call it."""
    return start_sum(tensor)()


def start_sum(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    """Start summing a tensor over all ranks, in place, without waiting; calling the result waits and
    returns it. The work done in between (a backward pass) hides the communication. Every rank must call it."""
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)

    def result() -> torch.Tensor:
        work.wait()
        return tensor

    return result


def exact_factor(
    stage: "Stage", losses: list[Mean], weight: torch.Tensor, samples: int, global_batch_size: int
) -> Callable[[], Factor]:
    """--global-batch-size / W, with W the weights of the update's losses summed over its micro-steps and every
    rank (`weight`: this rank's sum), to read after the last backward(); None where it is exactly 1.

    Unweighted losses of k values per sample (one per sample, or per token of fixed-length windows) weigh k
    times the update's `samples`, which every rank knows: nothing to sum, as in a hand-written loop. The ranks
    agree on k in the stage's first sum of W. Other losses' W is summed at every update, while backward() runs.
    """
    world = dist.get_world_size()
    counts = [loss.count for loss in losses if loss.count is not None]  # the unweighted losses' sizes
    unweighted = len(counts) == len(losses)
    share = rank_share(samples, world, len(losses), dist.get_rank())  # this rank's samples of the update
    per_sample = sum(counts) / share if unweighted and sum(counts) % share == 0 else 0.0  # 0: not a whole k
    if stage.values_per_sample and per_sample != stage.values_per_sample:
        raise StepError(
            f"train_step's loss for {stage.name!r} gave {stage.values_per_sample:g} per sample (unweighted) at first, "
            "not now: the ranks count its weight, not sum it; leave values out by weight 0 (Mean(losses, weights=kept))"
        )
    if stage.values_per_sample or (world == 1 and unweighted):  # a world of one counts on the host
        total = stage.values_per_sample * samples if stage.values_per_sample else sum(counts)
        factor = None if total == global_batch_size else global_batch_size / max(total, 1e-12)
        return lambda: factor
    first = stage.values_per_sample is None  # the ranks vote on k beside W: its sum and its squares' sum
    votes = [weight.new_tensor([per_sample, per_sample**2], dtype=torch.float64)] if first else []
    summed = start_sum(torch.cat([weight.to(torch.float64).reshape(1), *votes]))

    def exact() -> Factor:
        sums = summed()
        if first:  # all ranks' k alike (and whole), or none counted
            _, k, squares = sums.tolist()
            stage.values_per_sample = k / world if k > 0 and world * squares == k * k else 0.0
        return (global_batch_size / sums[0].clamp_min(1e-12)).float()

    return exact


def agree(decision: bool) -> bool:
    """Rank 0's decision, sent to every rank, so all ranks take the same branch.

    Every rank must call this, even those whose own decision does not matter: a collective
    inside a rank-0-only branch would leave the other ranks waiting forever.
    """
    flag = torch.tensor([float(decision)], device=_collective_device())
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def rank0_number(number: int) -> int:
    """Rank 0's number (the run folder it chose, say), sent to every rank; every rank must call this."""
    value = torch.tensor([number], dtype=torch.int64, device=_collective_device())
    dist.broadcast(value, src=0)
    return int(value.item())


def any_rank(*decisions: bool) -> list[bool]:
    """For each decision, whether any rank took it (a signal one rank received, say), known to every
    rank alike: one all-reduce for all of them."""
    flags = torch.tensor([float(decision) for decision in decisions], device=_collective_device())
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [bool(flag) for flag in flags.tolist()]


def wait_for_every_rank(failed: bool) -> bool:
    """Wait, as long as a day, until every rank gets here; whether any of them `failed` on the way.

    For data.py's prepare_data, which can take hours on some ranks: --dist-timeout-s bounds the
    training's collectives, so this waits in a group of its own (gloo: CPU tensors, any backend).
    """
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=1))
    flag = torch.tensor([float(failed)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    dist.destroy_process_group(group)
    return bool(flag.item())


def is_finite(value: torch.Tensor) -> bool:
    """Whether a value that every rank holds alike (a gradient norm, say) is finite."""
    return bool(torch.isfinite(value).item())


def all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """This tensor from every rank, in rank order, on the CPU; every rank must call it with the same
    shape and dtype. (Tensors, not pickled objects: object collectives would need numpy.)"""
    local = tensor.to(_collective_device())
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return [value.cpu() for value in gathered]


def barrier() -> None:
    """Wait until every rank gets here."""
    dist.barrier()


def _collective_device() -> torch.device:
    """NCCL only moves CUDA tensors; gloo only CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
