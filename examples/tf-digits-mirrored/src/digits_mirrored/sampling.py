"""Which samples each replica sees. Managed by the looptpl template: edit data.py instead.

Training: every epoch, one seeded shuffle of the train set, the same in every run and after
--resume, is cut into per-replica batches of global_batch_size / replicas samples. One input
pipeline feeds the replicas in turn (replica r takes the r-th batch of each step), so the union
over replicas is exactly the global batch one replica would see. At the end of an epoch a
replica may get a short batch, or an empty one. Nothing is sharded: tf.data's auto-shard
policies split data across workers, and this strategy has one.

Evaluation: each sample goes to exactly one replica, once, in batches of --eval-batch-size; a
replica left without samples at the end gets an empty batch, which adds nothing to the metrics.
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
    strategy: tf.distribute.Strategy, dataset: tf.data.Dataset, config: TrainConfig, epoch: int, samples: int
) -> tf.distribute.DistributedDataset:
    """The first `samples` of the train set's order for one epoch, batched per replica and distributed."""
    buffer = config.shuffle_buffer or split_size(dataset, "train")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # seed + epoch: a new order every epoch, the same in every run and after --resume.
        shuffled = dataset.shuffle(buffer, seed=config.seed + epoch, reshuffle_each_iteration=False).take(samples)
        per_replica = context.get_per_replica_batch_size(config.global_batch_size)
        return _pipeline(batches(shuffled, per_replica, "train"))

    return strategy.distribute_datasets_from_function(dataset_fn)


def distribute_eval(
    strategy: tf.distribute.Strategy, dataset: tf.data.Dataset, split: str, batch_size: int
) -> tf.distribute.DistributedDataset:
    """A validation or test set, in batches of `batch_size` per replica, each sample once, with the samples' indices."""
    size = split_size(dataset, split)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        indices = tf.data.Dataset.range(size).batch(batch_size)
        return _pipeline(tf.data.Dataset.zip(indices, batches(dataset, batch_size, split)))

    return strategy.distribute_datasets_from_function(dataset_fn)


def _pipeline(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Fix the pipeline's options and prefetch, so batches are ready before the step asks."""
    options = tf.data.Options()
    options.deterministic = True  # the same order in every run, so runs can be compared and resumed
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
