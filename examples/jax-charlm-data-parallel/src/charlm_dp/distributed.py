"""Data parallelism: one mesh over every device of every process. Managed by the looptpl template.

The loop's arrays are global: a batch is sharded along the mesh's `data` axis (each process holds
the rows its devices take), the weights and optimizer state are replicated. Inside the compiled update
a sum over the global batch is a sum over every device: XLA adds the collectives, so the code reads
as for one device and the mean is exact over the whole global batch.

Several processes (several hosts, or several CPU processes in tests) join with
`jax.distributed.initialize`: kit/launch.py sets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID for each; under Slurm, JAX finds them itself.
"""

import os
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from .kit.config import TrainConfig


@dataclass
class Runtime:
    """Where the run trains: the mesh of every device, and this process's place among the processes."""

    mesh: Mesh
    process: int
    processes: int

    @property
    def is_main(self) -> bool:
        """Whether this process writes the logs and prints (process 0)."""
        return self.process == 0

    @property
    def devices(self) -> int:
        return self.mesh.size


def setup(config: TrainConfig) -> Runtime:
    """Join the other processes (if any) and build the mesh, before any other JAX call."""
    if config.cpu_devices:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", config.cpu_devices)
    if "JAX_NUM_PROCESSES" in os.environ:
        jax.distributed.initialize(
            os.environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
        )
    elif int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        jax.distributed.initialize()
    # Auto axes: the compiler places the collectives (explicit axes, jax.make_mesh's default, would refuse
    # the sums over the batch that the loop writes as for one device).
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    config.check_batch_split(mesh.size)
    return Runtime(mesh, jax.process_index(), jax.process_count())


def building(runtime: Runtime) -> Any:
    """The context model.py builds the model in: the mesh, so that a weight annotated with a sharding
    (`nnx.with_partitioning(init, (None, "data"))`) is created sharded."""
    return jax.set_mesh(runtime.mesh)


def place(tree: Any, runtime: Runtime) -> Any:
    """Place every array of `tree` on every device (the weights and the optimizer state)."""
    return jax.device_put(tree, NamedSharding(runtime.mesh, PartitionSpec()))


def where(runtime: Runtime, state: Any) -> str:
    """Where the run trains, for its first line: the platform and the devices."""
    return f"{jax.devices()[0].platform}, {runtime.devices} device{'s' if runtime.devices > 1 else ''}"


def local_rows(length: int, runtime: Runtime) -> slice:
    """The rows of a batch dimension of `length` that this process loads (its devices' shards)."""
    per_process = length // runtime.processes
    return slice(runtime.process * per_process, (runtime.process + 1) * per_process)


def global_batch(local: Any, batch_axis: int, runtime: Runtime) -> Any:
    """The global arrays whose rows along `batch_axis` are every process's `local` rows, in process order,
    sharded along the mesh's data axis."""
    spec = PartitionSpec(*([None] * batch_axis), "data")
    sharding = NamedSharding(runtime.mesh, spec)
    if runtime.processes == 1:  # this process holds the whole batch: one copy, cheaper than assembling it
        return jax.device_put(local, sharding)

    def make(array: np.ndarray) -> jax.Array:
        shape = list(array.shape)
        shape[batch_axis] *= runtime.processes
        return jax.make_array_from_process_local_data(sharding, array, tuple(shape))

    return jax.tree.map(make, local)


def to_host(tree: Any) -> Any:
    """`tree`'s global arrays as NumPy arrays, whole, on every process (every process must call this)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def agree(decision: bool) -> bool:
    """Process 0's decision, shared with every process (every process must call this)."""
    return bool(process0_number(int(decision)))


def process0_number(number: int) -> int:
    """Process 0's number, sent to every process (every process must call this)."""
    if jax.process_count() == 1:
        return number
    # In two 31-bit halves: JAX computes in 32 bits unless told otherwise (a run folder's code has 16 digits).
    high, low = multihost_utils.broadcast_one_to_all(np.asarray([number // 2**31, number % 2**31], dtype=np.int32))
    return int(high) * 2**31 + int(low)


def any_process(decision: bool) -> bool:
    """Whether any process took `decision` (every process must call this)."""
    if jax.process_count() == 1:
        return decision
    return bool(multihost_utils.process_allgather(np.asarray(int(decision), dtype=np.int32)).any())
