"""The user contract of the torch template holds for the shapes people train: a padded, token-weighted
language model; a GAN with two optimizers; dict batches with two inputs and a non-decomposable
metric; a frozen teacher; a contrastive loss that needs every rank's embeddings.

Each is a real project: the examples in examples/ (copied, so runs never write into the repository),
or a fresh render whose user files a test rewrites. N ranks must train exactly like one rank with
the same global batch, and each equivalence test also shows that it would catch the bug it is
about (a naive variant that must fail it).
"""

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT, relative_difference, looptpl, train_torch, trained_weights

LM = REPO_ROOT / "examples" / "torch-charlm-ddp"
GAN = REPO_ROOT / "examples" / "torch-gan-ddp"
# Relative difference of the trained weights (conftest.relative_difference) allowed between 1 and 2 ranks:
# float noise is ~2e-7 for the language model; a GAN's game amplifies it to ~1e-5 in two epochs.
LM_TOLERANCE, GAN_TOLERANCE = 1e-5, 1e-4

# A small language model on few, short functions: one epoch of ~12 updates in a few seconds per run.
# --train-in-eval-mode turns its dropout off: 1 and 2 ranks would draw different masks.
TINY_LM = ("--epochs", "1", "--train-functions", "192", "--eval-functions", "51", "--max-bytes", "160")
TINY_LM += ("--width", "32", "--layers", "1", "--heads", "2", "--global-batch-size", "16", "--train-in-eval-mode")


def copy_project(example: Path, destination: Path) -> Path:
    shutil.copytree(example, destination, ignore=shutil.ignore_patterns("runs", "__pycache__", "*.egg-info"))
    return destination


def edit(project: Path, file: str, old: str, new: str) -> None:
    path = next((project / "src").glob(f"*/{file}"))
    text = path.read_text()
    assert old in text, f"{file} no longer holds {old!r}"
    path.write_text(text.replace(old, new))


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return copy_project(LM, tmp_path_factory.mktemp("lm") / "project")


def test_token_weighted_loss_is_exact_over_ranks_and_micro_steps(lm, tmp_path):
    # Functions of 48-160 bytes, padded per micro-batch: the global mean over real tokens is only
    # right if the engine divides by the real tokens of all ranks and micro-steps together.
    train_torch(lm, tmp_path / "one", *TINY_LM)
    train_torch(lm, tmp_path / "two", *TINY_LM, "--grad-accum-steps", "2", ranks=2)
    assert relative_difference(trained_weights(tmp_path / "one"), trained_weights(tmp_path / "two")) < LM_TOLERANCE
    one, two = records(tmp_path / "one")[-1], records(tmp_path / "two")[-1]
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-5)
    assert one["val_tokens"] == two["val_tokens"] > 51 * 40  # every real token of the split, counted once
    assert one["val_perplexity"] == pytest.approx(math.exp(one["val_loss"]))


def test_a_mean_of_micro_batch_means_fails_the_same_check(lm, tmp_path):
    # The bug of transformers#34242: each micro-batch averaged over its own tokens, then averaged.
    naive = copy_project(lm, tmp_path / "naive")
    edit(
        naive,
        "step.py",
        'return Mean(losses, weights=mask, per="token")\n\n\ndef eval_step',
        'return Mean(((losses * mask).sum() / mask.sum()).reshape(1))\n\n\ndef eval_step',
    )
    train_torch(naive, tmp_path / "one", *TINY_LM)
    train_torch(naive, tmp_path / "two", *TINY_LM, "--grad-accum-steps", "2", ranks=2)
    assert relative_difference(trained_weights(tmp_path / "one"), trained_weights(tmp_path / "two")) > 5 * LM_TOLERANCE


@pytest.fixture(scope="module")
def gan(tmp_path_factory) -> Path:
    return copy_project(GAN, tmp_path_factory.mktemp("gan") / "project")


GAN_RUN = ("--epochs", "2", "--global-batch-size", "64")


def test_gan_trains_both_networks_alike_on_two_ranks_with_accumulation(gan, tmp_path):
    train_torch(gan, tmp_path / "one", *GAN_RUN)
    train_torch(gan, tmp_path / "two", *GAN_RUN, "--grad-accum-steps", "2", ranks=2)
    one, two = trained_weights(tmp_path / "one"), trained_weights(tmp_path / "two")
    assert {name.split(".")[0] for name in one} == {"discriminator", "generator"}  # no frozen judge
    assert relative_difference(one, two) < GAN_TOLERANCE
    record = records(tmp_path / "two")[-1]
    assert {"train_discriminator_loss", "train_generator_loss", "val_diversity"} <= record.keys()


def test_gan_with_a_locally_scaled_loss_fails_the_same_check(gan, tmp_path):
    # The discriminator's loss divided by this rank's micro-batch instead of the global batch:
    # equal on one process, wrong wherever the micro-batches differ in size (the short last batch).
    naive = copy_project(gan, tmp_path / "naive")
    edit(naive, "step.py", 'yield "discriminator", Mean(torch.cat([real_loss, fake_loss]))',
         'yield "discriminator", Mean(torch.cat([real_loss, fake_loss]).mean().reshape(1))')  # fmt: skip
    train_torch(naive, tmp_path / "one", *GAN_RUN)
    train_torch(naive, tmp_path / "two", *GAN_RUN, "--grad-accum-steps", "2", ranks=2)
    assert relative_difference(trained_weights(tmp_path / "one"), trained_weights(tmp_path / "two")) > 10 * GAN_TOLERANCE


def test_gan_resume_with_two_optimizers_equals_an_uninterrupted_run(gan, tmp_path):
    train_torch(gan, tmp_path / "straight", *GAN_RUN)
    train_torch(gan, tmp_path / "resumed", *GAN_RUN, "--stop-after-epoch", "1")  # of 2
    train_torch(gan, tmp_path / "resumed", *GAN_RUN, "--resume")
    assert relative_difference(trained_weights(tmp_path / "straight"), trained_weights(tmp_path / "resumed")) == 0
    assert records(tmp_path / "straight") == [
        {**record, "epoch_time_s": records(tmp_path / "straight")[index]["epoch_time_s"]}
        for index, record in enumerate(records(tmp_path / "resumed"))
    ]
