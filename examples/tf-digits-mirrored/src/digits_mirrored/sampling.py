"""Which samples each replica sees. Managed by the looptpl template: edit data.py instead.

Training: every epoch, one seeded shuffle of the train set, the same in every run and after
--resume, is cut into global batches of --global-batch-size samples, and each global batch into
one near-equal part per replica. One input pipeline feeds the replicas in turn (replica r takes
part r of each global batch), so the union over replicas is exactly the global batch one replica
would see. A short last batch is kept if each micro-batch of each replica gets at least one
sample (train_step.py splits a replica's part evenly); a last batch with fewer samples than
replicas x --grad-accum-steps is left out, a different one every epoch. Nothing is sharded:
tf.data's auto-shard policies split data across workers, and this strategy has one.

Evaluation: the validation and test sets in global batches of --eval-batch-size x replicas,
cut like training batches, so each sample goes to exactly one replica, once. A last batch with
fewer samples than replicas is topped up with repeats of its samples, marked so that evaluation.py
leaves their results out: no replica is handed an empty batch, which some layers (Conv2D on the
CPU) cannot take.
"""

import tensorflow as tf

from .config import TrainConfig
from .data import make_batches
from .errors import DataError


def split_size(dataset: tf.data.Dataset, split: str) -> int:
    """Number of samples in a split, with a clear error when data.py returned something unusable."""
    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(
            f"data.py: the {split} dataset must be a tf.data.Dataset of samples, got {type(dataset).__name__}"
        )
    size = int(dataset.cardinality())
    if size < 0:
        raise DataError(
            f"data.py: the {split} dataset has no known size; add "
            ".apply(tf.data.experimental.assert_cardinality(number_of_samples))"
        )
    if size == 0:
        raise DataError(f"data.py: the {split} dataset is empty")
    return size


def epoch_size(train_size: int, config: TrainConfig, replicas: int) -> tuple[int, int]:
    """Updates and samples trained per epoch: a short last batch is kept if every micro-batch gets a sample."""
    full, rest = divmod(train_size, config.global_batch_size)
    if rest < replicas * config.grad_accum_steps:
        return full, full * config.global_batch_size
    return full + 1, train_size


def global_batch_sizes(samples: int, global_batch_size: int) -> list[int]:
    """Samples in each global batch of an epoch of `samples` (the last one may be short)."""
    full, rest = divmod(samples, global_batch_size)
    return [global_batch_size] * full + ([rest] if rest else [])


def batches(dataset: tf.data.Dataset, batch_size: int, split: str) -> tf.data.Dataset:
    """data.py's `make_batches`, checked to keep every sample: ceil(samples / batch_size) batches."""
    batched = make_batches(dataset, batch_size)
    expected = -(-int(dataset.cardinality()) // batch_size)
    if not isinstance(batched, tf.data.Dataset) or int(batched.cardinality()) not in (expected, -2):
        raise DataError(
            f"data.py: make_batches must cut the {split} set into {expected} batches of {batch_size} (the last may "
            "be short), keeping every sample; do not drop the remainder, shuffle or repeat there"
        )
    return batched


def distribute_train(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    config: TrainConfig,
    epoch: int,
    samples: int,
    start: int = 0,
) -> tf.distribute.DistributedDataset:
    """The first `samples` of the train set's order for one epoch, in global batches from batch `start` on
    (a resumed epoch), a part per replica."""
    buffer = config.shuffle_buffer or split_size(dataset, "train")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # seed + epoch: a new order every epoch, the same in every run and after --resume.
        shuffled = dataset.shuffle(buffer, seed=config.seed + epoch, reshuffle_each_iteration=False).take(samples)
        global_batches = batches(shuffled, config.global_batch_size, "train").skip(start)
        return _pipeline(_replica_parts(global_batches, context))

    return strategy.distribute_datasets_from_function(dataset_fn)


def distribute_eval(
    strategy: tf.distribute.Strategy, dataset: tf.data.Dataset, split: str, batch_size: int
) -> tf.distribute.DistributedDataset:
    """A validation or test set, `batch_size` samples per replica and step, each sample once, with the samples'
    indices (-1 for a repeat)."""
    size = split_size(dataset, split)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        replicas = context.num_replicas_in_sync
        indices = tf.data.Dataset.range(size).batch(batch_size * replicas)
        global_batches = tf.data.Dataset.zip(indices, batches(dataset, batch_size * replicas, split))
        topped_up = global_batches.map(lambda indices, batch: _row_for_every_replica(indices, batch, replicas))
        return _pipeline(_replica_parts(topped_up, context))

    return strategy.distribute_datasets_from_function(dataset_fn)


def _replica_parts(global_batches: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """Each global batch cut into one near-equal part per replica: the parts of the replicas this
    pipeline feeds, in turn."""
    replicas = context.num_replicas_in_sync
    mine = replicas // context.num_input_pipelines
    first = context.input_pipeline_id * mine

    def replica_parts(*items: object) -> tf.data.Dataset:
        batch = items[0] if len(items) == 1 else items  # tf.data passes a tuple's items as arguments
        return tf.data.Dataset.range(first, first + mine).map(lambda replica: part(batch, replica, replicas))

    return global_batches.flat_map(replica_parts)


def _row_for_every_replica(indices: tf.Tensor, batch: object, replicas: int) -> tuple[tf.Tensor, object]:
    """A batch with fewer rows than replicas topped up with repeats of its rows, whose index is -1."""
    rows = tf.shape(indices)[0]
    positions = tf.range(tf.maximum(rows, replicas))
    repeated = positions % rows
    topped_up = tf.nest.map_structure(lambda tensor: tf.gather(tensor, repeated), batch)
    return tf.where(positions < rows, tf.gather(indices, repeated), tf.constant(-1, tf.int64)), topped_up


def part(batch: object, index: tf.Tensor | int, parts: int) -> object:
    """Part `index` of a batch cut into `parts` near-equal parts (one row each at least, given `parts` rows)."""
    rows = tf.shape(tf.nest.flatten(batch)[0])[0]
    index = tf.cast(index, tf.int32)
    start, end = index * rows // parts, (index + 1) * rows // parts
    return tf.nest.map_structure(lambda tensor: tensor[start:end], batch)


def _pipeline(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Fix the pipeline's options and prefetch, so batches are ready before the step asks."""
    options = tf.data.Options()
    options.deterministic = True  # the same order in every run, so runs can be compared and resumed
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
