"""The torch template's samplers, imported from a rendered project: which sample each rank sees."""

import importlib
import itertools
import random
import sys

import pytest
import torch
from conftest import looptpl


@pytest.fixture(scope="module")
def sampling(tmp_path_factory):
    """The `sampling` module of a freshly rendered torch project."""
    destination = tmp_path_factory.mktemp("render") / "sampled"
    assert looptpl("new", str(destination), "--backend", "torch", "--strategy", "ddp", "--defaults").exit_code == 0
    sys.path.insert(0, str(destination / "src"))
    try:
        yield importlib.import_module("sampled.kit.sampling")
    finally:
        sys.path.remove(str(destination / "src"))


def epoch_order(sampling, size, batch, accum=1, ranks=1, seed=0, epoch=0, start=0, steps_per_epoch=0):
    """Per global batch, the indices every rank and micro-step saw, in one-process order."""
    samplers = [
        sampling.GlobalBatchSampler(size, batch, accum, rank, ranks, seed, steps_per_epoch) for rank in range(ranks)
    ]
    streams = []
    for sampler in samplers:
        sampler.set_epoch(epoch, start)
        streams.append(iter(sampler))
    batches = []
    for _ in range(samplers[0].updates_per_epoch - start):
        parts = {}
        for micro_step in range(accum):
            for rank, stream in enumerate(streams):
                parts[micro_step * ranks + rank] = list(next(stream))
        batches.append([index for part in sorted(parts) for index in parts[part]])
    for stream in streams:
        assert next(stream, None) is None, "a rank yielded more micro-batches than the epoch has"
    return batches


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64, 1003, 65_537])
def test_the_shuffle_is_a_permutation_different_each_epoch(sampling, size):
    orders = [sampling.Shuffle(size, seed=3, epoch=epoch)(torch.arange(size)).tolist() for epoch in range(3)]
    for order in orders:
        assert sorted(order) == list(range(size))
    assert orders[0] == sampling.Shuffle(size, seed=3, epoch=0)(torch.arange(size)).tolist()  # the same every run
    if size > 5:
        assert orders[0] != orders[1] != orders[2]
        assert orders[0] != sampling.Shuffle(size, seed=4, epoch=0)(torch.arange(size)).tolist()


def plain_shuffle(size, seed, epoch, positions):
    """Shuffle's order written plainly, a position at a time: six Feistel rounds over the position's bits, again
    until it lands in range(size). A resumed run and one that updated its template between two epochs rely on it."""
    draw = random.Random(seed * 1_000_003 + epoch)
    keys = [draw.getrandbits(31) for _ in range(6)]
    bits = max(1, (size - 1).bit_length())
    low = bits // 2
    masks = ((1 << (bits - low)) - 1, (1 << low) - 1)

    def mix(value, key):
        value = ((value ^ key) * 0x5BD1E995) & 0x7FFFFFFF
        value = ((value ^ (value >> 15)) * 0x27D4EB2D) & 0x7FFFFFFF
        return value ^ (value >> 13)

    order = []
    for index in positions:
        while True:
            halves = [index >> low, index & masks[1]]
            for round, key in enumerate(keys):
                halves[round % 2] ^= mix(halves[1 - round % 2], key) & masks[round % 2]
            index = (halves[0] << low) | halves[1]
            if index < size:
                break
        order.append(index)
    return order


@pytest.mark.parametrize("size", [1, 2, 3, 1003, 65_537, 10**9 + 7])
def test_the_shuffle_is_the_same_order_as_ever(sampling, size):
    positions = range(size) if size < 10**5 else range(size - 70_000, size)  # the last positions walk the most
    got = sampling.Shuffle(size, seed=5, epoch=2)(torch.tensor(positions)).tolist()
    assert got == plain_shuffle(size, 5, 2, positions)


def test_every_sample_once_per_epoch_and_ranks_split_the_one_process_batches(sampling):
    single = epoch_order(sampling, 1003, 64)
    assert [len(batch) for batch in single] == [64] * 15 + [43]  # the short last batch is kept
    assert sorted(itertools.chain(*single)) == list(range(1003))
    for ranks, accum in [(2, 1), (3, 2), (4, 2)]:
        assert epoch_order(sampling, 1003, 48 if ranks == 3 else 64, accum, ranks) == epoch_order(
            sampling, 1003, 48 if ranks == 3 else 64
        )
    assert epoch_order(sampling, 1003, 64, epoch=1) != single


def test_computing_the_order_in_chunks_changes_nothing(sampling, monkeypatch):
    whole = epoch_order(sampling, 1003, 64, ranks=2, epoch=2)
    monkeypatch.setattr(sampling.Shuffle, "CHUNK", 7)  # a chunk of less than one batch: one batch at a time
    assert epoch_order(sampling, 1003, 64, ranks=2, epoch=2) == whole
    monkeypatch.setattr(sampling.Shuffle, "CHUNK", 200)  # chunks of three batches
    assert epoch_order(sampling, 1003, 64, ranks=2, epoch=2) == whole
    assert epoch_order(sampling, 1003, 64, ranks=2, epoch=2, start=5) == whole[5:]  # a resume starts there


def test_a_huge_train_set_never_builds_its_permutation(sampling, monkeypatch):
    monkeypatch.setattr(torch, "randperm", lambda *args, **kwargs: pytest.fail("built a whole permutation"))
    asked = []
    shuffle = sampling.Shuffle.__call__
    monkeypatch.setattr(
        sampling.Shuffle, "__call__", lambda self, positions: asked.append(len(positions)) or shuffle(self, positions)
    )
    sampler = sampling.GlobalBatchSampler(10**9, 1024, 1, rank=1, world_size=2, seed=0)
    sampler.set_epoch(7, start=123_456)
    first = next(iter(sampler))
    assert len(first) == 512 and all(0 <= index < 10**9 for index in first) and first.epoch == 7
    assert asked == [sampling.Shuffle.CHUNK]


def test_steps_per_epoch_takes_the_first_batches_of_each_epochs_own_order(sampling):
    whole = [epoch_order(sampling, 1003, 64, epoch=epoch) for epoch in range(2)]
    for ranks, accum in [(1, 1), (2, 2)]:
        for epoch in range(2):
            sampler = sampling.GlobalBatchSampler(1003, 64, accum, 0, ranks, 0, steps_per_epoch=5)
            assert sampler.updates_per_epoch == 5 and sampler.samples_between(0, 5) == 320
            capped = epoch_order(sampling, 1003, 64, accum, ranks, epoch=epoch, steps_per_epoch=5)
            assert capped == whole[epoch][:5]
            assert epoch_order(sampling, 1003, 64, accum, ranks, epoch=epoch, start=3, steps_per_epoch=5) == capped[3:]
    assert whole[0][:5] != whole[1][:5]  # each epoch trains on another part of the set
    # A cap beyond the set changes nothing (16 updates, the short last one kept).
    assert sampling.GlobalBatchSampler(1003, 64, 1, 0, 1, 0, steps_per_epoch=99).updates_per_epoch == 16


def test_evaluation_shards_cover_the_split_once_and_pad_to_the_longest(sampling):
    for size, batch, ranks, limit in [(251, 16, 1, 0), (251, 16, 2, 0), (257, 256, 4, 0), (3, 2, 4, 0)]:
        check_evaluation_shards(sampling, sampling.evaluated_samples(size, limit), batch, ranks)
    for size, batch, ranks, limit in [(1000, 100, 3, 0), (1000, 16, 3, 7 * 16), (65_537, 64, 2, 5 * 64)]:
        check_evaluation_shards(sampling, sampling.evaluated_samples(size, limit), batch, ranks)


def check_evaluation_shards(sampling, samples, batch, ranks):
    samplers = [sampling.EvalBatchSampler(samples, batch, rank, ranks) for rank in range(ranks)]
    assert len({len(sampler) for sampler in samplers}) == 1  # every rank runs as many batches
    real = []
    for rank, sampler in enumerate(samplers):
        batches = list(sampler)
        assert len(batches) == len(sampler)
        shard = list(samples)[rank::ranks]
        expected = [shard[start : start + batch] for start in range(0, len(shard), batch)]
        assert batches[: sampler.real_batches] == expected and sampler.real_size == len(shard)
        assert batches[sampler.real_batches :] == [[samples[0]]] * (len(sampler) - sampler.real_batches)
        real += [index for part in expected for index in part]
    assert sorted(real) == list(samples)


def test_eval_batches_draw_one_fixed_subset_spread_over_the_split(sampling):
    # --eval-batches 7 of 16: the same 112 samples every time (no run seed, no rank count in the draw),
    # in dataset order, each once, and spread over the split rather than its first 112.
    first = sampling.evaluated_samples(10_000, 7 * 16)
    assert list(first) == list(sampling.evaluated_samples(10_000, 7 * 16)) == sorted(set(first))
    assert len(first) == 112 and first[-1] > 5_000 and first != list(range(112))
    assert sampling.evaluated_samples(100, 112) == sampling.evaluated_samples(100, 0) == range(100)


class Augmented(torch.utils.data.Dataset):
    """Samples 0..99; from index `from_index` on, each adds a draw of the generator `kind`."""

    def __init__(self, kind: str, from_index: int) -> None:
        self.kind, self.from_index = kind, from_index

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> float:
        if index < self.from_index or self.kind == "none":
            return float(index)
        import random

        import numpy

        draw = {"torch": lambda: torch.rand(()).item(), "python": random.random, "numpy": numpy.random.random}
        return index + draw[self.kind]()


@pytest.mark.parametrize("kind", ["none", "torch", "python", "numpy"])
def test_each_sample_draws_as_if_every_generator_were_seeded_for_it(sampling, kind):
    # Only the generators data.py draws from are seeded; a draw first made deep in the data (index 60
    # on) still gets the numbers a sample seeded for every generator gets, in any order of batches.
    def seeded_for_every_generator(batch):
        with sampling.callers_generators_kept():
            items = []
            for index in batch:
                sampling.seed_generators(sampling.sample_seeds(7, batch.epoch, [index])[0])
                items.append(Augmented(kind, 60)[index])
            return items

    batches = [sampling.MicroBatch(torch.arange(start, start + 10), epoch=1) for start in range(0, 100, 10)]
    for order in (batches, batches[::-1]):
        samples = sampling.SeededSamples(Augmented(kind, 60), seed=7)
        before = torch.get_rng_state()
        assert [samples.__getitems__(batch) for batch in order] == list(map(seeded_for_every_generator, order))
        assert torch.equal(torch.get_rng_state(), before)  # the caller's generators are left as they were
        assert samples.seeded == (set() if kind == "none" else {kind})  # the others cost nothing


@pytest.mark.parametrize("kind", ["torch", "python", "numpy"])
def test_a_sample_draws_anew_every_epoch_and_with_every_seed(sampling, kind):
    # torch's CPU generator and NumPy's keep only 32 bits of a seed: a sample's seed that differed only
    # above them gave it the same augmentation in every epoch and with every --seed.
    def draws(seed, epoch):
        samples = sampling.SeededSamples(Augmented(kind, 0), seed)
        items = samples.__getitems__(sampling.MicroBatch(torch.arange(100), epoch))
        return [item - index for index, item in enumerate(items)]

    first = draws(7, 1)
    assert draws(7, 1) == first  # the same seed and epoch: the same draws
    assert len(set(first)) == 100  # every sample its own
    for other in (draws(7, 2), draws(8, 1)):
        assert all(left != right for left, right in zip(first, other, strict=True))
    seeds = sampling.sample_seeds(7, 1, range(2**16))
    assert len(set(seeds)) == 2**16 and max(seeds) < 2**32  # distinct in an epoch, and what torch keeps of a seed


def test_torchs_own_tensor_data_sets_are_not_watched_and_every_other_is(sampling, monkeypatch):
    # Watching the generators costs ~35 us a batch: torch's data sets that only index tensors draw
    # nothing, so they skip it; a subclass with its own __getitem__, or any other data set, is watched.
    from torch.utils.data import ConcatDataset, Subset, TensorDataset

    tensors = TensorDataset(torch.arange(10.0))

    class Drawing(TensorDataset):
        def __getitem__(self, index):
            return (self.tensors[0][index] + torch.rand(()),)

    pure = [tensors, Subset(tensors, [1, 2]), ConcatDataset([tensors, Subset(tensors, [3])])]
    watched = [Drawing(torch.arange(10.0)), Subset(Drawing(torch.arange(10.0)), [1]), Augmented("none", 60)]
    assert [sampling.draws_nothing(dataset) for dataset in pure] == [True] * 3
    assert [sampling.draws_nothing(dataset) for dataset in watched] == [False] * 3
    calls = []
    states = sampling.generator_states
    monkeypatch.setattr(sampling, "generator_states", lambda *names: calls.append(1) or states(*names))
    batch = sampling.MicroBatch(torch.tensor([4, 5]), epoch=1)
    assert sampling.SeededSamples(tensors, seed=7).__getitems__(batch) == [tensors[4], tensors[5]]
    assert calls == []
    sampling.SeededSamples(watched[0], seed=7).__getitems__(sampling.MicroBatch(torch.tensor([4]), 1))
    assert calls


class Unmoved:
    """Samples 0..99; sample 60 makes a draw that leaves its generator's position where it was."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> float:
        import random

        import numpy

        if index != 60:
            return float(index)
        if self.kind == "numpy-cached-gaussian":  # takes the Gaussian NumPy's last normal draw cached
            return float(numpy.random.standard_normal())
        if self.kind == "python-cached-gaussian":  # takes the Gaussian Python's last random.gauss cached
            return random.gauss(0.0, 1.0)
        return float(sum(random.getrandbits(32) for _ in range(624)))  # Python's keys, remade; same position


@pytest.mark.parametrize("kind", ["numpy-cached-gaussian", "python-cached-gaussian", "python-whole-twister"])
def test_a_draw_that_leaves_the_generator_position_unchanged_is_seen(sampling, kind):
    # SeededSamples does not copy NumPy's whole state for every batch, nor compare Python's whole key
    # array: these draws must be seen all the same, and seeded like any other.
    import numpy

    samples = sampling.SeededSamples(Unmoved(kind), seed=7)
    numpy.random.seed(0)
    numpy.random.standard_normal()  # the caller's draws leave a Gaussian cached
    random.seed(0)
    random.gauss(0.0, 1.0)
    assert samples.__getitems__(sampling.MicroBatch(torch.arange(10), 1)) == [float(index) for index in range(10)]
    state, python_state = numpy.random.get_state(), random.getstate()
    with sampling.callers_generators_kept():
        sampling.seed_generators(sampling.sample_seeds(7, 1, [60])[0])
        expected = Unmoved(kind)[60]
    assert samples.__getitems__(sampling.MicroBatch(torch.tensor([60]), 1)) == [expected]
    assert samples.seeded == {"numpy" if kind.startswith("numpy") else "python"}
    after = numpy.random.get_state()
    assert (after[1] == state[1]).all() and after[2:] == state[2:]  # the caller's Gaussians are still cached
    assert random.getstate() == python_state


def test_numpys_generator_replaced_between_batches_is_watched_in_its_place(sampling):
    # The twister is read through a view made once per generator: after numpy.random.set_bit_generator,
    # a view kept of the old one would see no draw, and the new one's draws would go unseeded.
    import numpy

    original = numpy.random.get_bit_generator()
    samples = sampling.SeededSamples(Augmented("numpy", 60), seed=7)
    try:
        assert samples.__getitems__(sampling.MicroBatch(torch.arange(10), 1)) == [float(index) for index in range(10)]
        with sampling.callers_generators_kept():
            sampling.seed_generators(sampling.sample_seeds(7, 1, [60])[0])
            expected = Augmented("numpy", 60)[60]
        numpy.random.set_bit_generator(numpy.random.MT19937(5))  # then nothing else reads numpy's state
        assert samples.__getitems__(sampling.MicroBatch(torch.tensor([60]), 1)) == [expected]
        assert samples.seeded == {"numpy"}
    finally:
        numpy.random.set_bit_generator(original)


def test_a_tensor_data_sets_batches_are_fetched_whole_and_are_what_default_collate_makes(sampling):
    # With data.py's collate left as torch's default_collate, a TensorDataset's batch (or a Subset's, as
    # random_split makes) is each tensor indexed at once: the same batches, train and evaluation, on every
    # rank and micro-step, as the row-by-row path with a collate of data.py's own.
    import importlib

    from torch.utils.data import ConcatDataset, Subset, TensorDataset, default_collate

    loaders = importlib.import_module("sampled.kit.loaders")
    config = importlib.import_module("sampled.kit.config").parse_config(
        ["--device", "cpu", "--global-batch-size", "20", "--grad-accum-steps", "2", "--eval-batch-size", "8"]
    )
    generator = torch.Generator().manual_seed(0)
    base = TensorDataset(torch.randn(103, 3, generator=generator), torch.arange(103), torch.rand(103).double())
    train = Subset(base, torch.randperm(103, generator=generator)[:91])
    datasets = (train, base, TensorDataset(torch.arange(17.0)))

    def batches(collate, rank):
        split = loaders.Loaders(datasets, config, rank, 2, torch.device("cpu"), collate)
        updates = split.start_epoch(1, 0)
        trained = [split.next_update(updates, update) for update in range(split.updates_per_epoch)]
        evaluated = [list(split.evaluation_batches(name)) for name in ("val", "test")]
        return split, trained, evaluated

    def same(left, right):
        if isinstance(left, torch.Tensor):
            return left.dtype == right.dtype and torch.equal(left, right)
        if isinstance(left, list | tuple):
            return type(left) is type(right) and len(left) == len(right) and all(map(same, left, right))
        return left == right

    for rank in range(2):
        fast, *fetched = batches(default_collate, rank)
        slow, *collated = batches(lambda items: default_collate(items), rank)
        assert fast.train.dataset.rows is not None and slow.train.dataset.rows is None  # the one path and the other
        assert same(fetched, collated)
    subclass = type("Mine", (TensorDataset,), {"__getitem__": lambda self, index: self.tensors[0][index]})
    others = [subclass(torch.arange(3)), ConcatDataset([base, base]), Subset(Subset(base, [1, 2]), [0])]
    assert [sampling.TensorRows.of(dataset) for dataset in others] == [None] * 3  # each row by row, as before
