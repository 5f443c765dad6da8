"""Which samples each replica sees. Managed by the looptpl template: edit data.py instead.

Training: every epoch, one seeded shuffle of the train set, the same in every run, on every
worker and after --resume, is cut into global batches of --global-batch-size samples (with
--steps-per-epoch, only the first ones: each epoch a different part of a large train set), and each
global batch into one near-equal part per replica. Every worker reads the whole order and feeds
its own replicas their parts in turn, so the union over all replicas is exactly the global batch
one replica would see. A short last batch is kept if each micro-batch of each replica gets at
least one sample (train.py's TrainStep splits a replica's part evenly); a last batch with fewer samples
than replicas x --grad-accum-steps is left out, a different one every epoch.

A stream (a train set of unknown size: lines read from files, say) has no order to shuffle: its
consecutive samples make the global batches, cut alike, each sample used once per pass, and the
passes follow one another for --max-steps updates. Each global batch comes with its place in the
stream, (pass, global batches of it), which checkpoints keep: a resumed run reads that pass again
up to there and goes on, so data.py's stream must give the same samples in the same order on
every pass and every worker (shuffle it there with a fixed seed and reshuffle_each_iteration=False).

Evaluation: the validation and test sets in global batches of --eval-batch-size x replicas, cut
like training batches, so each sample goes to exactly one replica, once; a split of unknown size
is counted as it is read. With --eval-batches, a fixed subset of the split, drawn once (the same
samples every time and for any number of replicas; a split of unknown size: its first samples).
A last batch with fewer samples than replicas is topped up with repeats
of its samples, marked so that evaluation.py leaves their results out: no replica is handed an
empty batch, which some layers (Conv2D on the CPU) cannot take.

On one device the batches stay a plain tf.data dataset: strategy.run takes them as they are, and
a distributed dataset's iterator costs about three times as much per batch (on the CPU).

The functions of this module that tf.data traces for every run (do_not_convert) are traced as the
plain Python they are: AutoGraph's rewrite, which they do not need, cost each run tenths of a second.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from .config import TrainConfig
from .errors import ConfigError, DataError, TrainingError, in_your_code

# data.py's make_batches(dataset, batch_size): how the loop cuts a split into batches.
MakeBatches = Callable[[tf.data.Dataset, int], tf.data.Dataset]


class TrainSplit:
    """The train set's global batches for an epoch (or from the stream's position), a part per replica.

    Build it under `strategy.scope()`: a stream's position is a variable the checkpoints hold.
    """

    def __init__(
        self, strategy: tf.distribute.Strategy, dataset: tf.data.Dataset, config: TrainConfig, make_batches: MakeBatches
    ) -> None:
        self.strategy = strategy
        self.dataset = dataset
        self.make_batches = make_batches  # data.py's
        self.config = config
        self.splits = strategy.num_replicas_in_sync * config.grad_accum_steps  # micro-batches in an update
        # A stream's (pass, global batches of it trained on), set by the train step after every update.
        self.stream_position: tf.Variable | None = None
        self.size = _size(dataset, "train")  # negative for a stream
        if self.size < 0:
            if not config.max_steps:
                raise ConfigError(
                    "data.py's train set is a stream (a tf.data.Dataset of unknown size): train it for --max-steps "
                    "updates, or state its size with .apply(tf.data.experimental.assert_cardinality(number))"
                )
            if config.steps_per_epoch:
                raise ConfigError(
                    "--steps-per-epoch: data.py's train set is a stream, whose epoch is --max-steps updates; drop "
                    "the flag, or state the stream's size with .apply(tf.data.experimental.assert_cardinality(number))"
                )
            if config.shuffle_buffer:
                raise ConfigError(
                    "--shuffle-buffer: data.py's train set is a stream, which is trained in its order; drop the "
                    "flag and shuffle the stream in data.py (a fixed seed, reshuffle_each_iteration=False)"
                )
            self.stream_position = tf.Variable([0, 0], dtype=tf.int64, trainable=False)
            # A streamed run is one epoch of --max-steps updates, over as many passes as that takes.
            self.updates_per_epoch, self.samples_per_epoch = config.max_steps, None
            if not list(self._one_pass(tf.constant(0, tf.int64)).take(1)):
                raise DataError(
                    f"data.py: the train stream gave no global batch (fewer than {self.splits} samples: replicas x "
                    "--grad-accum-steps)"
                )
            return
        if config.global_batch_size > self.size:
            raise ConfigError(
                f"--global-batch-size {config.global_batch_size} is larger than the train set ({self.size} samples); "
                "lower it, or add data"
            )
        full, rest = divmod(self.size, config.global_batch_size)
        keep_short = rest >= self.splits  # every micro-batch of a short last batch gets a sample
        self.updates_per_epoch = full + keep_short
        self.samples_per_epoch = self.size if keep_short else full * config.global_batch_size
        if 0 < config.steps_per_epoch < self.updates_per_epoch:  # the first updates of each epoch's shuffle
            self.updates_per_epoch = config.steps_per_epoch
            self.samples_per_epoch = config.steps_per_epoch * config.global_batch_size

    def distribute(self, epoch: int, start: int) -> Any:
        """Epoch `epoch` from global batch `start` on (a resumed epoch); a stream from its saved position on."""
        if self.stream_position is not None:
            first_pass, done = (int(value) for value in self.stream_position.numpy())
            return _distribute(self.strategy, lambda replicas: self._stream(first_pass).skip(done), with_position=True)
        config = self.config
        buffer = config.shuffle_buffer or self.size

        def global_batches(replicas: int) -> tf.data.Dataset:
            # seed + epoch: a new order every epoch, the same on every worker and after --resume.
            order = self.dataset.shuffle(buffer, seed=config.seed + epoch, reshuffle_each_iteration=False)
            batched = batches(order.take(self.samples_per_epoch), config.global_batch_size, "train", self.make_batches)
            return batched.skip(start)

        return _distribute(self.strategy, global_batches)

    def check_trained(self, samples: int, first: int, end: int) -> None:
        """Fail if updates first..end of an epoch trained on other than their samples (a stream's are not known)."""
        if self.samples_per_epoch is None:
            return
        full, rest = divmod(self.samples_per_epoch, self.config.global_batch_size)
        sizes = [self.config.global_batch_size] * full + ([rest] if rest else [])  # of the epoch's global batches
        expected = sum(sizes[first:end])
        if samples != expected:
            raise TrainingError(
                f"trained on {samples} samples this epoch, expected {expected}; data.py's make_batches "
                "must keep every sample"
            )

    def checkpointed(self) -> dict[str, tf.Variable]:
        """What checkpoints hold of the train set: a stream's position (a map-style epoch's is the loop's)."""
        return {} if self.stream_position is None else {"stream_position": self.stream_position}

    def _stream(self, first_pass: int) -> tf.data.Dataset:
        """The stream's global batches from pass `first_pass` on, each with its (pass, global batches of it so far)."""
        # At most a pass per update: a stream that gives nothing on a later pass runs out instead of looping.
        return tf.data.Dataset.range(first_pass, first_pass + self.config.max_steps + 1).flat_map(self._one_pass)

    def _one_pass(self, number: tf.Tensor) -> tf.data.Dataset:
        """Pass `number` in global batches with their positions (a short last one if each micro-batch gets a sample)."""
        with in_your_code("in make_batches on the train stream"):
            whole = self.make_batches(self.dataset, self.config.global_batch_size)
        kept = whole.filter(lambda *batch: rows(batch) >= self.splits)
        return kept.enumerate(start=1).map(lambda index, batch: (tf.stack([number, index]), batch))


@dataclass(frozen=True)
class EvalSplit:
    """A validation or test set in global batches, a part per replica, with the samples' indices."""

    batches: Any  # a distributed dataset (on one device, a tf.data one)
    # A split whose samples and batches are known in number repeats its passes: each evaluation takes
    # one pass (`per_pass` global batches, `samples` samples) from one iterator, as making a distributed
    # dataset's iterator costs a fifth of a second (its prefetched batches wait there between evaluations).
    # None: read to its end, from a new iterator each time.
    per_pass: int | None
    samples: int | None


def distribute_eval(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    split: str,
    config: TrainConfig,
    make_batches: MakeBatches,
) -> EvalSplit:
    """A validation or test set (with --eval-batches, its subset), --eval-batch-size samples per replica and step,
    each sample once, with the samples' indices (-1 for a repeat)."""
    size = _size(dataset, split)
    if size == tf.data.INFINITE_CARDINALITY:
        raise DataError(f"data.py: the {split} dataset repeats forever; evaluation reads it to its end: drop .repeat()")
    batch_size = config.eval_batch_size
    if config.eval_batches:
        dataset = evaluated_samples(dataset, size, config.eval_batches * batch_size)
    global_batch = batch_size * strategy.num_replicas_in_sync
    batched = batches(dataset, global_batch, split, make_batches)
    samples, per_pass = int(dataset.cardinality()), int(batched.cardinality())
    known = samples >= 0 and per_pass >= 0

    def global_batches(replicas: int) -> tf.data.Dataset:
        indices = tf.data.Dataset.counter().batch(global_batch)  # numbered as `batched` is cut
        numbered = tf.data.Dataset.zip(indices, batched).map(
            functools.partial(_numbered_for_every_replica, replicas=replicas)
        )
        return numbered.repeat() if known else numbered

    return EvalSplit(_distribute(strategy, global_batches), per_pass if known else None, samples if known else None)


def evaluated_samples(dataset: tf.data.Dataset, size: int, samples: int) -> tf.data.Dataset:
    """`samples` samples of a split, in dataset order, drawn by a fixed seed, not --seed: the same for every
    evaluation, every number of replicas and runs with other seeds, so their figures compare. A split of
    unknown size gives its first `samples`."""
    if size < 0:
        return dataset.take(samples)
    if samples >= size:
        return dataset
    keep = np.zeros(size, dtype=bool)
    keep[np.random.default_rng(0).choice(size, samples, replace=False)] = True
    kept = tf.constant(keep)
    # Traced as the plain Python they are (see the module's docstring; AutoGraph warned it could not read them).
    is_kept = tf.autograph.experimental.do_not_convert(lambda index, sample: kept[index])
    sample_of = tf.autograph.experimental.do_not_convert(lambda index, sample: sample)
    chosen = dataset.enumerate().filter(is_kept).map(sample_of)
    # Finding them reads the whole split (seconds for a million samples): every evaluation after the first
    # reads them from memory.
    return chosen.apply(tf.data.experimental.assert_cardinality(samples)).cache()


def batches(dataset: tf.data.Dataset, batch_size: int, split: str, make_batches: MakeBatches) -> tf.data.Dataset:
    """data.py's `make_batches`, checked to keep every sample: ceil(samples / batch_size) batches."""
    with in_your_code(f"in make_batches on the {split} set"):
        batched = make_batches(dataset, batch_size)
    size = int(dataset.cardinality())
    expected = -(-size // batch_size)
    if not isinstance(batched, tf.data.Dataset) or (size >= 0 and int(batched.cardinality()) not in (expected, -2)):
        raise DataError(
            f"data.py: make_batches must cut the {split} set into {expected} batches of {batch_size} (the last may "
            "be short), keeping every sample; do not drop the remainder, shuffle or repeat there"
        )
    return batched


def part(batch: object, index: tf.Tensor | int, parts: int) -> object:
    """Part `index` of a batch cut into `parts` near-equal parts (one row each at least, given `parts` rows)."""
    count = rows(batch)
    index = tf.cast(index, tf.int32)
    start, end = index * count // parts, (index + 1) * count // parts
    return tf.nest.map_structure(lambda tensor: tensor[start:end], batch)


def rows(batch: object) -> tf.Tensor:
    """The number of samples in a batch: the first dimension of its first tensor."""
    return tf.shape(tf.nest.flatten(batch)[0])[0]


def _size(dataset: tf.data.Dataset, split: str) -> int:
    """A split's number of samples (negative: unknown or infinite), with a clear error for an unusable one."""
    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(
            f"data.py: the {split} dataset must be a tf.data.Dataset of samples, got {type(dataset).__name__}"
        )
    size = int(dataset.cardinality())
    if size == 0:
        raise DataError(f"data.py: the {split} dataset is empty")
    return size


def _distribute(
    strategy: tf.distribute.Strategy, global_batches: Callable[[int], tf.data.Dataset], with_position: bool = False
) -> Any:
    """The global batches `global_batches(replicas)` makes, a part per replica; on one device, as they are."""
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return _pipeline(global_batches(1))

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return _pipeline(_replica_parts(global_batches(context.num_replicas_in_sync), context, with_position))

    return strategy.distribute_datasets_from_function(dataset_fn)


def _replica_parts(
    global_batches: tf.data.Dataset, context: tf.distribute.InputContext, with_position: bool
) -> tf.data.Dataset:
    """Each global batch cut into one near-equal part per replica: the parts of the replicas this
    pipeline feeds, in turn. With `with_position`, elements are (position, batch) and each part
    keeps the position whole."""
    replicas = context.num_replicas_in_sync
    mine = replicas // context.num_input_pipelines
    first = context.input_pipeline_id * mine

    @tf.autograph.experimental.do_not_convert  # see the module's docstring
    def replica_parts(*items: object) -> tf.data.Dataset:
        # tf.data passes a tuple's items as arguments.
        position, batch = items if with_position else (None, items[0] if len(items) == 1 else items)
        own_replicas = tf.data.Dataset.range(first, first + mine)
        if position is None:
            return own_replicas.map(lambda replica: part(batch, replica, replicas))
        return own_replicas.map(lambda replica: (position, part(batch, replica, replicas)))

    return global_batches.flat_map(replica_parts)


@tf.autograph.experimental.do_not_convert  # see the module's docstring
def _numbered_for_every_replica(indices: tf.Tensor, batch: object, replicas: int) -> tuple[tf.Tensor, object]:
    """A batch with its samples' indices; one with fewer rows than replicas is topped up with repeats of
    its rows, whose index is -1."""
    count = rows(batch)
    indices = indices[:count]  # the last batch may be short
    if replicas == 1:
        return indices, batch
    positions = tf.range(tf.maximum(count, replicas))
    repeated = positions % count
    topped_up = tf.nest.map_structure(lambda tensor: tf.gather(tensor, repeated), batch)
    return tf.where(positions < count, tf.gather(indices, repeated), tf.constant(-1, tf.int64)), topped_up


def _pipeline(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Fix the pipeline's options and prefetch, so batches are ready before the step asks."""
    options = tf.data.Options()
    options.deterministic = True  # the same order in every run, so runs can be compared and resumed
    # Every worker keeps its own replicas' parts (_replica_parts): tf.data must not shard the
    # pipeline again, even if it is passed to experimental_distribute_dataset.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
