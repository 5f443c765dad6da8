"""Checkpoints with tf.train.Checkpoint and CheckpointManager. Managed by the looptpl template.

A checkpoint holds the model, the optimizer (with its update count, which drives the learning-rate
schedule, and under fp16 the loss scale), the epoch and step counters, the early-stopping state
and the config. TensorFlow checkpoints follow objects, not devices: one written by N replicas
loads into any strategy and any number of replicas. Saving is atomic: TensorFlow writes the data
under a temporary name and renames it, and the `checkpoint` file lists a save only once complete.

With several workers (multi-worker), every worker must save, and every worker restores from the
chief's directory: --run-dir must be on storage every worker can read (a shared filesystem, or a
bucket such as gs://) for --resume and --test-on best.
"""

import dataclasses
import json
from pathlib import Path

import keras
import tensorflow as tf
from tensorflow.core.protobuf.trackable_object_graph_pb2 import TrackableObjectGraph

from ..distributed import Runtime
from .config import TrainConfig
from .contract import template_version
from .errors import CheckpointError, first_line

CONFIG_KEY = "config/.ATTRIBUTES/py_state"  # where a checkpoint holds ConfigState's JSON


class ConfigState(tf.train.experimental.PythonState):
    """The run's config as JSON, stored in every checkpoint beside the weights, with the template version
    that wrote it (named if a later version cannot continue the run).

    Restoring does not change the running config: the checkpoint's copy lands in `saved`, so a
    resumed run can check that it keeps the settings the checkpoint depends on.
    """

    def __init__(self, config: TrainConfig) -> None:
        written = {**dataclasses.asdict(config), "template_version": template_version()}
        self.text = json.dumps(written, sort_keys=True)
        self.saved: dict[str, object] = {}

    def serialize(self) -> str:
        return self.text

    def deserialize(self, string_value: bytes) -> None:
        self.saved = json.loads(string_value)


class HooksState(tf.train.experimental.PythonState):
    """What hooks.py's `state_dict` returned, as JSON, stored in every checkpoint.

    The loop sets `text` before each save; a restore leaves the checkpoint's copy in `saved`
    for hooks.py's `load_state_dict`.
    """

    def __init__(self) -> None:
        self.text = "{}"
        self.saved: dict[str, object] = {}

    def serialize(self) -> str:
        return self.text

    def deserialize(self, string_value: bytes) -> None:
        self.saved = json.loads(string_value)


class Checkpointer:
    """Saves `epoch-N` after every epoch (the newest --keep-checkpoints), the best epoch in `best/`, and
    `steps/step-S` after update S part-way through an epoch (--checkpoint-every, --stop-after-step, SIGTERM)."""

    def __init__(self, run_dir: Path, keep: int, runtime: Runtime, **objects: object) -> None:
        self.directory = run_dir / "checkpoints"
        self.runtime = runtime
        self.checkpoint = tf.train.Checkpoint(**objects)
        self.names = set(objects)  # what a checkpoint of this template version holds at its top level
        # Every worker must save: saving reads variables, which can take a collective (a variable
        # summed across replicas is all-reduced on read). Only the chief's files are real; the
        # others write to a scratch directory of their own, removed after each save.
        self.scratch = None if runtime.is_main else run_dir / f".scratch-worker-{runtime.task_id}"
        if self.scratch is not None and tf.io.gfile.exists(str(self.scratch)):
            tf.io.gfile.rmtree(str(self.scratch))  # left by a worker killed while saving
        write_to = self.scratch or self.directory
        self.epochs = tf.train.CheckpointManager(self.checkpoint, str(write_to), keep, checkpoint_name="epoch")
        self.best = tf.train.CheckpointManager(self.checkpoint, str(write_to / "best"), 1, checkpoint_name="best")
        within = write_to / "steps"  # part-way through an epoch
        self.steps = tf.train.CheckpointManager(self.checkpoint, str(within), keep, checkpoint_name="step")

    def save(self, epoch: int, is_best: bool) -> None:
        """Write `best/best-<epoch>` if it is the best so far, then `epoch-<epoch>`. Every worker calls this.

        Best first: a crash between the two then resumes from the previous epoch, whose
        early-stopping state never points at a best epoch that `best/` lacks.
        """
        if is_best:
            self.best.save(checkpoint_number=epoch)
        self.epochs.save(checkpoint_number=epoch)
        self.clear_scratch()

    def save_within_epoch(self, update: int) -> None:
        """Write `steps/step-<update>`, part-way through an epoch. Every worker calls this."""
        self.steps.save(checkpoint_number=update)
        self.clear_scratch()

    def clear_scratch(self) -> None:
        """Remove what a worker other than the chief just wrote: only the chief's checkpoints are kept."""
        if self.scratch is not None:
            tf.io.gfile.rmtree(str(self.scratch))

    def restore_latest(self, updates_per_epoch: int) -> None:
        """Restore the newest readable checkpoint, epoch end or part-way; a damaged one is reported and skipped.

        `checkpoint`, the list of saves, is rewritten only after a save is complete, so a save
        cut short by a crash is not in it. A file damaged later (a truncated copy, a bad disk)
        fails TensorFlow's checks (sizes, a checksum per tensor) and the next older one is used.
        """
        # Newest first, by the update each was written after: epoch N's end is update N x updates_per_epoch.
        written = [(updates_per_epoch * number, path) for number, path in _saves(self.directory)]
        written += _saves(self.directory / "steps")
        for _, path in sorted(written, reverse=True):
            try:
                status = self.checkpoint.restore(path)
            except Exception as error:  # a damaged file raises DataLossError, NotFoundError, IndexError, ...
                print(f"warning: skipping unreadable checkpoint {path} ({first_line(error)}); using an older one")
                continue
            try:
                status.assert_existing_objects_matched()
            except AssertionError:
                if lacks := sorted(self.names - saved_objects(path)):  # not your files' doing: the template's
                    raise CheckpointError(
                        f"{path} was written by {written_by(path)} (it holds no {', '.join(lacks)}), whose runs "
                        "this loop cannot continue; finish the run with the template version that wrote it "
                        "(git log -- .copier-answers.yml), or drop --resume to start a new run"
                    ) from None
                raise CheckpointError(
                    f"{path} does not match this model and optimizer; did model.py, optim.py or --precision "
                    "change since it was written? Drop --resume to start a new run"
                ) from None
            return
        shared = ", and check that every worker sees the chief's --run-dir (shared storage)"
        raise CheckpointError(
            f"no readable checkpoint in {self.directory} to resume from; drop --resume to start a new run"
            + (shared if self.runtime.workers > 1 else "")
        )

    def holds_checkpoints(self) -> bool:
        """Whether the run directory holds a finished save of either kind."""
        return bool(_saves(self.directory) or _saves(self.directory / "steps"))

    def load_best(self, model: keras.Model | dict[str, keras.Model]) -> str:
        """Load the best epoch's weights into `model` (for the final test).

        Returns "best", or "last" when there is no best checkpoint, or "last (best unreadable)" when
        it is damaged: the last weights are then kept as they were, and tested instead.
        """
        path = tf.train.latest_checkpoint(str(self.directory / "best"))
        if path is None:
            return "last"
        variables = [variable for network in tf.nest.flatten(model) for variable in network.weights]
        last = [variable.numpy() for variable in variables]
        try:
            tf.train.Checkpoint(model=model).read(path).expect_partial()  # only the weights
        except Exception as error:  # a damaged file raises DataLossError, NotFoundError, ...
            print(f"warning: cannot load the best checkpoint {path} ({first_line(error)}); testing the last weights")
            for variable, value in zip(variables, last, strict=True):  # a read cut short may have loaded some
                variable.assign(value)
            return "last (best unreadable)"
        return "best"


def saved_objects(path: str) -> set[str]:
    """The names of the objects a checkpoint holds at its top level (model, optimizer, epoch, ...)."""
    graph = TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(path).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return {child.local_name for child in graph.nodes[0].children}


def written_by(path: str) -> str:
    """The template version that wrote a checkpoint, as its config records it (since the checkpoints of
    late 2026; older ones record none)."""
    try:
        config = json.loads(tf.train.load_checkpoint(path).get_tensor(CONFIG_KEY))
    except (tf.errors.OpError, ValueError, TypeError):  # no config, or none readable
        config = {}
    version = config.get("template_version") if isinstance(config, dict) else None
    return f"template version {version}" if version else "an older version of the template"


def _saves(directory: Path) -> list[tuple[int, str]]:
    """The finished saves listed in a directory's `checkpoint` file, with their numbers."""
    state = tf.train.get_checkpoint_state(str(directory))
    paths = state.all_model_checkpoint_paths if state else []
    return [(int(path.rsplit("-", 1)[1]), path) for path in paths]
