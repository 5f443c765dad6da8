"""Checkpoints with Orbax: the training state (weights, optimizer state, update count), sharded as
it is, beside the run's position in its data. Managed by the looptpl template.

Every process calls `save` (each writes its own shards). Orbax writes a checkpoint into a temporary
folder, renames it into place and marks it with commit_success.txt: a checkpoint without the mark
(a run killed while writing) is never read back. With --async-checkpoints the writing goes on in a
background thread once the state is copied to host memory; the next save, a restore and `wait` wait
for it.
"""

import json
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from .errors import CheckpointError

COMMITTED = "commit_success.txt"


class Checkpoints:
    """The checkpoints of a run in `folder`, by update count: the newest `keep`, and the best epoch's."""

    def __init__(self, folder: Path, keep: int, asynchronous: bool = False) -> None:
        self.folder, self.asynchronous = folder, asynchronous
        policies = ocp.checkpoint_managers
        # The best is the newest saved as best: Orbax keeps the highest "best" value, the update count.
        best = policies.BestN(
            get_metric_fn=lambda metrics: metrics["best"], n=1, keep_checkpoints_without_metrics=False
        )
        kept = policies.AnyPreservationPolicy([policies.LatestN(n=keep), best])
        options = ocp.CheckpointManagerOptions(preservation_policy=kept, enable_async_checkpointing=asynchronous)
        self.manager = ocp.CheckpointManager(folder.absolute(), options=options)

    def save(self, updates: int, state: Any, position: dict[str, Any], best: bool = False) -> None:
        """Save `state` and the run's `position` as the checkpoint of `updates`, the best so far if `best`
        (every process calls this)."""
        meta = ocp.args.JsonSave(position)
        arguments = ocp.args.Composite(state=ocp.args.StandardSave(state), position=meta)
        self.manager.save(updates, args=arguments, metrics={"best": updates} if best else None)
        if not self.asynchronous:
            self.manager.wait_until_finished()

    def wait(self) -> None:
        """Wait until the checkpoint being written (--async-checkpoints) is finished, marked and kept."""
        self.manager.wait_until_finished()

    def latest(self) -> int | None:
        """The update count of the newest finished checkpoint, or None."""
        finished = [step for step in self.manager.all_steps() if (self.folder / str(step) / COMMITTED).exists()]
        return max(finished, default=None)

    def restore(self, updates: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """The state saved at `updates`, placed as `like` is (its shapes, types and shardings), and the position."""
        self.wait()
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        try:
            restored = self.manager.restore(
                updates,
                args=ocp.args.Composite(state=ocp.args.StandardRestore(target), position=ocp.args.JsonRestore()),
            )
        except (ValueError, KeyError, FileNotFoundError, json.JSONDecodeError) as error:
            raise CheckpointError(
                f"the checkpoint {self.folder / str(updates)} cannot be read back ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}); start a new --run-dir, or delete that folder "
                "to resume from the one before"
            ) from None
        return restored["state"], dict(restored["position"])
