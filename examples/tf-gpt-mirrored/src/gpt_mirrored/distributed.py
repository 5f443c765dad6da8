"""The tf.distribute strategy: every device of this machine. Managed by the looptpl template.

MirroredStrategy keeps one copy of each variable on every device (a replica) and runs each step
on all of them at once, each on its own share of the global batch; the gradients are summed
across replicas before every update, so the copies stay identical. Edit model.py instead.
"""

from dataclasses import dataclass

import tensorflow as tf

from .kit.config import TrainConfig


@dataclass(frozen=True)
class Runtime:
    """The strategy, and this process's part in the run.

    The loop and train.py coordinate processes only through `is_main` (the process that logs
    and writes files), `agree` and `any_worker`. Here one process holds every replica, so it is the
    chief and has no one to agree with; the multi-worker template fills them in.
    """

    strategy: tf.distribute.Strategy
    is_main: bool = True
    task_id: int = 0  # this process's index among the run's processes
    workers: int = 1  # the run's processes

    def agree(self, decision: bool) -> bool:
        """The chief's decision, shared with every process: here, the decision itself."""
        return decision

    def chief_number(self, number: int) -> int:
        """The chief's number, shared with every process: here, the number itself."""
        return number

    def any_worker(self, decision: bool) -> bool:
        """Whether any process decided so: here, the decision itself."""
        return decision


def setup(config: TrainConfig) -> Runtime:
    """One replica per local GPU, or per logical CPU device with --cpu-replicas."""
    if config.cpu_replicas:
        # Split the one physical CPU into N logical devices, one replica each: the multi-replica
        # path (all-reduce, uneven last batch) runs and can be tested without GPUs. This must
        # happen before TensorFlow initializes its devices, so setup() runs first in train.py.
        tf.config.set_visible_devices([], "GPU")
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(config.cpu_replicas)]
        )
        devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    else:
        devices = [device.name for device in tf.config.list_logical_devices("GPU")] or ["/cpu:0"]
    return Runtime(tf.distribute.MirroredStrategy(devices))
