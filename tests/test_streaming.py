"""Training and evaluation on a stream (data.py returns a torch IterableDataset).

Every rank reads the whole stream and keeps its share: each update's items must be the stream's
consecutive items, split over ranks and micro-steps as a map-style global batch is, every item once
per pass; N ranks must train like one, a resumed run like an uninterrupted one, and a streamed
evaluation split must give what the same items give map-style.
"""

import importlib
import sys
from pathlib import Path

import pytest
from conftest import (
    answers,
    copy_project,
    edit,
    in_parallel,
    looptpl,
    records,
    relative_difference,
    run,
    train_torch,
    trained_weights,
)
from torch.utils.data import DataLoader, IterableDataset

STREAMED_DATA = '''

class Stream(IterableDataset):
    """The synthetic task's items, streamed: each pass in its own order, with a little noise added."""

    def __init__(self, items: TensorDataset) -> None:
        self.items, self.epoch = items, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(self.items), generator=torch.Generator().manual_seed(self.epoch))
        for index in order.tolist():
            inputs, target = self.items[index]
            yield inputs + 0.01 * torch.randn_like(inputs), target  # drawn from the generator the engine seeds


_build_datasets = build_datasets


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset]:
    train, val, test = _build_datasets(config)
    return Stream(train), val, test
'''
EVALUATION_STREAM = '''

class InOrder(IterableDataset):
    """A map-style split's items, streamed in their order."""

    def __init__(self, items: TensorDataset) -> None:
        self.items = items

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (self.items[index] for index in range(len(self.items)))


_map_style = build_datasets


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset]:
    train, val, test = _map_style(config)
    return train, InOrder(val), InOrder(test)
'''
# 1003 items, 64 a global batch: 15 full ones and a short one of 43 make a pass of 16 updates.
FLAGS = ("--max-steps", "40", "--global-batch-size", "64", "--warmup-steps", "5")


def with_data(project: Path, extra: str) -> None:
    path = project / "src" / answers(project)["package_name"] / "data.py"
    text = path.read_text().replace("\nimport torch\n", "\nfrom collections.abc import Iterator\n\nimport torch\n", 1)
    text = text.replace(
        "from torch.utils.data import Dataset,", "from torch.utils.data import Dataset, IterableDataset,"
    )
    path.write_text(text + extra)


@pytest.fixture(scope="module")
def streamed(tmp_path_factory) -> Path:
    """A ddp project whose train split is a stream."""
    project = tmp_path_factory.mktemp("streamed") / "streamed"
    assert looptpl("new", str(project), "--backend", "torch", "--strategy", "ddp", "--no-git").exit_code == 0
    with_data(project, STREAMED_DATA)
    return project


@pytest.fixture(scope="module")
def streaming(streamed):
    """The project's streaming module, imported."""
    sys.path.insert(0, str(streamed / "src"))
    try:
        yield importlib.import_module("streamed.kit.streaming")
    finally:
        sys.path.remove(str(streamed / "src"))


class Numbers(IterableDataset):
    """0, 1, ..., size - 1; pass n adds 1000 * n, so passes can be told apart."""

    def __init__(self, size: int) -> None:
        self.size, self.epoch = size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(range(1000 * self.epoch, 1000 * self.epoch + self.size))


def updates(streaming, size, batch, accum, rank, ranks, workers=0, start=(0, 0), count=40):
    """What a rank's DataLoader yields: [(position, samples, micro-batches of numbers)] for `count` updates."""
    config = type("Config", (), {"global_batch_size": batch, "grad_accum_steps": accum, "seed": 0})()
    stream = streaming.TrainStream(Numbers(size), config, rank, ranks)
    stream.start = start
    loader = DataLoader(stream, batch_size=None, num_workers=workers, collate_fn=stream.collater(lambda items: items))
    taken = []
    for update in loader:
        taken.append((update["position"], update["samples"], update["micro_batches"]))
        if len(taken) == count:
            return taken
    raise AssertionError("the stream ended")


def test_updates_are_consecutive_items_split_over_ranks_and_micro_steps(streaming):
    one = updates(streaming, 103, 10, 1, 0, 1)
    # 103 items: 10 global batches of 10 and one of 3, then the next pass.
    assert [samples for _, samples, _ in one[:12]] == [10] * 10 + [3, 10]
    assert [micro[0] for _, _, micro in one[:11]] == [
        list(range(start, min(start + 10, 103))) for start in range(0, 103, 10)
    ]
    assert one[11][2][0] == list(range(1000, 1010)) and one[11][0] == (1, 1)
    for ranks, accum in [(2, 1), (3, 1), (2, 2)]:
        for workers in (0, 2):
            per_rank = [updates(streaming, 103, 12, accum, rank, ranks, workers) for rank in range(ranks)]
            single = updates(streaming, 103, 12, 1, 0, 1)
            for update in range(40):
                parts = {
                    step * ranks + rank: per_rank[rank][update][2][step]
                    for rank in range(ranks)
                    for step in range(accum)
                }
                assert [item for part in sorted(parts) for item in parts[part]] == single[update][2][0]
                assert {per_rank[rank][update][:2] for rank in range(ranks)} == {single[update][:2]}


def test_a_pass_too_short_for_every_micro_batch_is_dropped_and_resume_goes_on_where_it_stopped(streaming):
    # 41 items, 10 a batch, 2 ranks x 2 micro-steps: the last 1 item cannot give each micro-batch one.
    assert [samples for _, samples, _ in updates(streaming, 41, 10, 2, 0, 2, count=5)] == [10, 10, 10, 10, 10]
    straight = updates(streaming, 103, 10, 1, 0, 1, count=30)
    for stopped in (3, 11, 17):
        position = straight[stopped - 1][0]
        assert updates(streaming, 103, 10, 1, 0, 1, start=position, count=30 - stopped) == straight[stopped:]


class Draws(IterableDataset):
    """Ten items a pass, each a draw from torch's, Python's and NumPy's generators."""

    def __iter__(self):
        import random

        import numpy
        import torch

        return ((torch.rand(()).item(), random.random(), numpy.random.random()) for _ in range(10))


def test_a_streamed_item_draws_anew_every_pass_and_with_every_seed(streaming):
    # An item's draws are seeded from (--seed, pass, position): the same after a resume, new every pass.
    def draws(seed, passes=2):
        config = type("Config", (), {"global_batch_size": 10, "grad_accum_steps": 1, "seed": seed})()
        stream = iter(streaming.TrainStream(Draws(), config, 0, 1))
        return [next(stream)["micro_batches"][0] for _ in range(passes)]

    first, second = draws(7)
    assert draws(7) == [first, second]
    for left, right in [(first, second), (first, draws(8)[0])]:
        assert all(a != b for items in zip(left, right, strict=True) for a, b in zip(*items, strict=True))


def test_evaluation_shards_cover_the_stream_once_and_pad_to_the_longest(streaming):
    # The last case is --eval-batches 3 of 16 over a stream of 1000: its first 48 items.
    for size, batch, ranks, limit in [(251, 16, 2, 0), (3, 2, 4, 0), (1000, 100, 3, 0), (1000, 16, 3, 48)]:
        seen, lengths = [], set()
        for rank in range(ranks):
            for workers in (0, 2):
                stream = streaming.EvalStream(range(size), batch, rank, ranks, "val", limit)
                loader = DataLoader(stream, batch_size=None, num_workers=workers, collate_fn=stream.collater(list))
                elements = list(loader)
                lengths.add(len(elements))
                real = [element for element in elements if not element["padding"]]
                assert elements[: len(real)] == real  # padding comes last
                if workers == 0:
                    seen += [item for element in real for item in element["batch"]]
                    assert [item for element in real for item in element["batch"]] == list(
                        range(rank, limit or size, ranks)
                    )
        assert sorted(seen) == list(range(limit or size)) and len(lengths) == 1


@pytest.mark.slow
def test_a_stream_trains_alike_on_one_and_two_ranks_and_resumes_exactly(streamed, tmp_path):
    every = ("--checkpoint-every", "10")

    def stopped_and_resumed(name: str, *flags: str, ranks: int = 1) -> None:
        """Stopped in the middle of the second pass, then resumed."""
        train_torch(streamed, tmp_path / name, *FLAGS, *every, "--stop-after-step", "23", *flags, ranks=ranks)
        train_torch(streamed, tmp_path / name, *FLAGS, *every, "--resume", *flags, ranks=ranks)

    in_parallel(
        lambda: train_torch(streamed, tmp_path / "one", *FLAGS),
        lambda: train_torch(streamed, tmp_path / "two", *FLAGS, "--grad-accum-steps", "2", ranks=2),
        lambda: stopped_and_resumed("resumed-0", "--num-workers", "0"),
        lambda: stopped_and_resumed("resumed-2", "--num-workers", "2"),
        lambda: stopped_and_resumed("resumed-two", ranks=2),
    )
    one = trained_weights(tmp_path / "one")
    assert relative_difference(one, trained_weights(tmp_path / "two")) < 1e-5
    steps = [record["step"] for record in records(tmp_path / "one")]
    assert steps == [40]  # a streamed run is one epoch of --max-steps updates, over 2.5 passes
    # Resumed in the middle of the second pass: the same run, to the bit.
    for workers in ("0", "2"):
        assert relative_difference(one, trained_weights(tmp_path / f"resumed-{workers}")) == 0
    assert relative_difference(trained_weights(tmp_path / "two"), trained_weights(tmp_path / "resumed-two")) < 1e-6


@pytest.mark.slow
def test_a_streamed_evaluation_split_counts_every_item_once(tmp_path):
    project = tmp_path / "evaluated"
    assert looptpl("new", str(project), "--backend", "torch", "--strategy", "ddp", "--no-git").exit_code == 0
    flags = ("--epochs", "1", "--eval-batch-size", "16")
    train_torch(project, tmp_path / "map-style", *flags, ranks=2)
    with_data(project, EVALUATION_STREAM)
    train_torch(project, tmp_path / "streamed", *flags, ranks=2)
    expected, got = records(tmp_path / "map-style")[0], records(tmp_path / "streamed")[0]
    assert got["val_samples"] == 251
    for name in ("val_loss", "val_accuracy"):
        assert got[name] == pytest.approx(expected[name], rel=1e-6)


def test_a_stream_without_max_steps_is_refused_in_one_line(streamed, tmp_path):
    module = ["-m", "streamed.train", "--run-dir", str(tmp_path), "--device", "cpu", "--epochs", "2"]
    result = run([sys.executable, *module], cwd=streamed, env={"PYTHONPATH": str(streamed / "src")})
    assert result.returncode == 2 and "Traceback" not in result.stdout
    assert (
        "data.py's train set is a stream (an IterableDataset) of unknown length: train it for --max-steps"
        in result.stdout
    )


def test_streams_of_different_lengths_on_the_ranks_stop_the_run_in_one_line(streamed, tmp_path):
    # Rank 1's stream yields 500 of the 1003 items: it starts its second pass at update 8, while rank 0
    # is half-way through its first. The ranks would train on different data; the run stops at its next log.
    project = copy_project(streamed, tmp_path / "unequal")
    short = "for index in order.tolist()[: 500 if os.environ.get('RANK') == '1' else None]:"
    edit(project, "data.py", "for index in order.tolist():", short)
    iterator = "from collections.abc import Iterator\n"
    edit(project, "data.py", iterator, "import os\n" + iterator)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    module = ["-m", "streamed.train", "--run-dir", str(tmp_path / "run"), "--device", "cpu", "--log-every", "5"]
    environment = {"PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    result = run([*launcher, *module, *FLAGS], cwd=project, env=environment)
    assert result.returncode != 0
    assert "data.py: the ranks' train streams have passes of different lengths (seen at update 10)" in result.stdout
    assert str(project / "src") not in result.stdout  # no traceback through the project's code (torchrun has its own)
