"""Training and evaluation on a TensorFlow stream (data.py returns a tf.data.Dataset of unknown size).

The stream's consecutive samples make the global batches, each with its (pass, batch) position;
every worker keeps its own replicas' parts; N replicas must train like one, a run resumed from a
step checkpoint like an uninterrupted one (the position is in the checkpoint), and a split of
unknown size must evaluate to what the same samples give with a known size.
"""

import importlib
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import edit, in_parallel, records, relative_difference
from test_contract_tf import mirrored_project, tf_weights, train_tf

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow: pip install tensorflow-cpu"
)

MADE = "make_split(1007), make_split(251), make_split(257)"  # data.py's train, val and test splits
# 1007 samples, 64 a global batch: 15 full ones and a short one of 47 make a pass of 16 updates.
FLAGS = ("--max-steps", "40", "--global-batch-size", "64", "--warmup-steps", "5")


def with_splits(project: Path, returned: str) -> None:
    """data.py's build_datasets returns `returned` from the synthetic task's train, val and test splits."""
    edit(project, "data.py", f"    return {MADE}\n", f"    train, val, test = {MADE}\n    {returned}\n")


@pytest.fixture(scope="module")
def streamed(tmp_path_factory) -> Path:
    """A mirrored project whose train split is a stream: filter() hides its size, as reading files does."""
    project = mirrored_project(tmp_path_factory.mktemp("tf_streamed"), "tf_streamed")
    with_splits(project, "return train.filter(lambda inputs, target: True), val, test")
    return project


@pytest.fixture(scope="module")
def sampling(streamed):
    """The project's sampling module, imported."""
    sys.path.insert(0, str(streamed / "src"))
    try:
        module = importlib.import_module("tf_streamed.kit.sampling")
        module.make_batches = importlib.import_module(
            "tf_streamed.data"
        ).make_batches  # data.py's, as train.py hands it
        yield module
    finally:
        sys.path.remove(str(streamed / "src"))


def settings(**changed: int) -> SimpleNamespace:
    values = {"global_batch_size": 10, "grad_accum_steps": 1, "max_steps": 40, "shuffle_buffer": 0, "seed": 0}
    values |= {"steps_per_epoch": 0, "eval_batch_size": 4, "eval_batches": 0}
    return SimpleNamespace(**{**values, **changed})


def numbers(size: int):
    """0, 1, ..., size - 1, as a stream."""
    import tensorflow as tf

    return tf.data.Dataset.range(size).filter(lambda number: True)


def stream_of(sampling, size: int, **changed: int):
    import tensorflow as tf

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    return sampling.TrainSplit(strategy, numbers(size), settings(**changed), sampling.make_batches)


def taken(dataset, count: int) -> list[tuple[tuple[int, int], list[int]]]:
    return [(tuple(position.numpy().tolist()), batch.numpy().tolist()) for position, batch in dataset.take(count)]


def test_a_streams_global_batches_are_its_consecutive_samples_pass_after_pass(sampling):
    # 103 samples in batches of 10: 10 full ones, then a short one of 3, which 4 micro-batches cannot share.
    for accum, per_pass in [(1, 11), (4, 10)]:
        split = stream_of(sampling, 103, grad_accum_steps=accum)
        assert split.updates_per_epoch == 40 and split.samples_per_epoch is None
        straight = taken(split.distribute(0, 0), 30)
        assert [position for position, _ in straight] == [
            (number // per_pass, number % per_pass + 1) for number in range(30)
        ]
        assert [batch for _, batch in straight[:per_pass]] == [
            list(range(start, min(start + 10, 103))) for start in range(0, 10 * per_pass, 10)
        ]
        assert straight[per_pass][1] == list(range(10))  # the next pass starts from the first sample
        # A resumed run goes on after the position its checkpoint holds, in a pass or at its end.
        for stopped in (3, per_pass, per_pass + 4):
            split.stream_position.assign(straight[stopped - 1][0])
            assert taken(split.distribute(0, 0), 30 - stopped) == straight[stopped:]
            split.stream_position.assign([0, 0])


def test_every_worker_keeps_its_replicas_parts_each_with_the_whole_batchs_position(sampling):
    import tensorflow as tf

    # 2 workers x 2 replicas: each worker's pipeline reads the whole stream and keeps 2 of the 4 parts.
    split = stream_of(sampling, 103, grad_accum_steps=4)  # 4 parts an update, as 4 replicas make
    global_batches = split._stream(0).take(11)
    expected = [(tuple(position.numpy().tolist()), batch.numpy().tolist()) for position, batch in global_batches]
    parts = {}
    for worker in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker, num_replicas_in_sync=4)
        elements = list(sampling._replica_parts(global_batches, context, with_position=True))
        for index, (position, batch) in enumerate(elements):
            parts[index // 2, 2 * worker + index % 2] = (tuple(position.numpy().tolist()), batch.numpy().tolist())
    for update, (position, batch) in enumerate(expected):
        assert {parts[update, replica][0] for replica in range(4)} == {position}
        assert [sample for replica in range(4) for sample in parts[update, replica][1]] == batch
        assert all(parts[update, replica][1] for replica in range(4))  # no replica is handed an empty part


def test_a_stream_is_refused_in_one_line_where_it_cannot_work(sampling):
    import tensorflow as tf

    errors = importlib.import_module("tf_streamed.kit.errors")
    with pytest.raises(errors.ConfigError, match=r"train set is a stream .* train it for --max-steps"):
        stream_of(sampling, 103, max_steps=0)
    with pytest.raises(errors.ConfigError, match=r"--shuffle-buffer: data\.py's train set is a stream"):
        stream_of(sampling, 103, shuffle_buffer=50)
    with pytest.raises(errors.ConfigError, match=r"--steps-per-epoch: data\.py's train set is a stream"):
        stream_of(sampling, 103, steps_per_epoch=5)
    with pytest.raises(errors.DataError, match=r"the train stream gave no global batch \(fewer than 4 samples"):
        stream_of(sampling, 3, grad_accum_steps=4)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    # A mistake in data.py's make_batches (or in a function it hands tf.data) is one line naming its line.
    mistaken = "def make_batches(dataset, size):\n    return dataset.batch(size).map(lambda batch: batch.nope)\n"
    user_code: dict = {}
    exec(compile("\n" * 40 + mistaken, str(Path(sampling.__file__).parents[1] / "data.py"), "exec"), user_code)
    with pytest.raises(errors.RunError, match=r"^data\.py:42 failed in make_batches on the train stream: Attr"):
        sampling.TrainSplit(strategy, numbers(103), settings(), user_code["make_batches"])
    with pytest.raises(errors.DataError, match="the val dataset repeats forever"):
        sampling.distribute_eval(strategy, tf.data.Dataset.range(5).repeat(), "val", settings(), sampling.make_batches)


@pytest.mark.slow
def test_a_stream_trains_alike_on_one_and_two_replicas_and_resumes_exactly(streamed, tmp_path):
    every = ("--checkpoint-every", "10")
    in_parallel(
        lambda: train_tf(streamed, tmp_path / "one", *FLAGS),
        lambda: train_tf(streamed, tmp_path / "two", *FLAGS, "--grad-accum-steps", "2", replicas=2),
        lambda: train_tf(streamed, tmp_path / "straight", *FLAGS, *every, replicas=2),
        lambda: train_tf(streamed, tmp_path / "resumed", *FLAGS, *every, "--stop-after-step", "23", replicas=2),
    )
    one = tf_weights(tmp_path / "one")
    assert relative_difference(one, tf_weights(tmp_path / "two")) < 1e-5
    assert [record["step"] for record in records(tmp_path / "one")] == [40]  # one epoch of 40 updates, 2.5 passes

    # Stopped in the middle of the second pass and resumed: the same run, to the bit.
    output = train_tf(streamed, tmp_path / "resumed", *FLAGS, *every, "--resume", replicas=2)
    assert "resumed after update 23, part-way through epoch 1 (update 23 of 40)" in output
    assert relative_difference(tf_weights(tmp_path / "straight"), tf_weights(tmp_path / "resumed")) == 0
    straight, resumed = records(tmp_path / "straight"), records(tmp_path / "resumed")
    assert len(resumed) == 1 and resumed[0]["val_loss"] == straight[0]["val_loss"]


@pytest.mark.slow
def test_a_split_of_unknown_size_evaluates_every_sample_once(tmp_path):
    project = mirrored_project(tmp_path, "evaluated")
    flags = ("--epochs", "1", "--eval-batch-size", "16")
    train_tf(project, tmp_path / "sized", *flags, replicas=2)
    hidden = "lambda inputs, target: True"
    with_splits(project, f"return train, val.filter({hidden}), test.filter({hidden})")
    train_tf(project, tmp_path / "unknown", *flags, replicas=2)
    expected, got = records(tmp_path / "sized")[0], records(tmp_path / "unknown")[0]
    assert got["val_samples"] == 251
    for name in ("val_loss", "val_accuracy"):
        assert got[name] == pytest.approx(expected[name], rel=1e-6)
