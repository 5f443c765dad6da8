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
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    REPO_ROOT,
    SUBSET_FLAGS,
    TORCH,
    answers,
    check_subset_runs,
    copy_project,
    doc_blocks,
    edit,
    in_parallel,
    looptpl,
    records,
    relative_difference,
    run,
    train_torch,
    trained_weights,
    write_blocks,
)

LM = REPO_ROOT / "examples" / "torch-charlm-ddp"
GAN = REPO_ROOT / "examples" / "torch-gan-ddp"
# Relative difference of the trained weights (conftest.relative_difference) allowed between 1 and 2 ranks:
# float noise is ~2e-7 for the language model; a GAN's game amplifies it to ~1e-5 in two epochs.
LM_TOLERANCE, GAN_TOLERANCE = 1e-5, 1e-4

# A small language model on few, short functions: one epoch of ~12 updates in a few seconds per run.
# --train-in-eval-mode turns its dropout off: 1 and 2 ranks would draw different masks.
TINY_LM = ("--epochs", "1", "--train-functions", "192", "--eval-functions", "51", "--max-bytes", "160")
TINY_LM += ("--width", "32", "--layers", "1", "--heads", "2", "--global-batch-size", "16", "--train-in-eval-mode")


def run_failing(project: Path, run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    """One training process that must fail; returns its output."""
    module = ["-m", f"{answers(project)['package_name']}.train", "--run-dir", str(run_dir), "--device", "cpu"]
    result = run(
        [sys.executable, *module, "--no-progress", *flags], cwd=project, env={"PYTHONPATH": str(project / "src")}
    )
    assert result.returncode != 0, result.stdout[-3000:]
    return result


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return copy_project(LM, tmp_path_factory.mktemp("lm") / "project")


def test_token_weighted_loss_is_exact_over_ranks_and_micro_steps(lm, tmp_path):
    # Functions of 48-160 bytes, padded per micro-batch: the global mean over real tokens is only
    # right if the engine divides by the real tokens of all ranks and micro-steps together.
    in_parallel(
        lambda: train_torch(lm, tmp_path / "one", *TINY_LM),
        lambda: train_torch(lm, tmp_path / "two", *TINY_LM, "--grad-accum-steps", "2", ranks=2),
    )
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
        "return Mean(((losses * mask).sum() / mask.sum()).reshape(1))\n\n\ndef eval_step",
    )
    in_parallel(
        lambda: train_torch(naive, tmp_path / "one", *TINY_LM),
        lambda: train_torch(naive, tmp_path / "two", *TINY_LM, "--grad-accum-steps", "2", ranks=2),
    )
    assert relative_difference(trained_weights(tmp_path / "one"), trained_weights(tmp_path / "two")) > 5 * LM_TOLERANCE


# Run in the language model's project: the bytes autograd keeps for the backward pass (weights aside)
# and the gradients, with and without --activation-checkpointing, dropout on.
RECOMPUTATION = """
import torch
from charlm_ddp.kit.config import parse_config
from charlm_ddp.kit.models import checkpoint_activations
from charlm_ddp.model import build_model, checkpoint_units

config = parse_config(["--width", "64", "--layers", "4", "--heads", "2", "--max-bytes", "128"])
ids = torch.randint(0, 256, (8, 128), generator=torch.Generator().manual_seed(0))


def saved_bytes_and_gradients(recompute):
    torch.manual_seed(0)
    model = build_model(config).train()
    if recompute:
        checkpoint_activations(model, checkpoint_units)
    weights = {param.untyped_storage().data_ptr() for param in model.parameters()}
    saved = []

    def keep(tensor):
        if tensor.untyped_storage().data_ptr() not in weights:
            saved.append(tensor.numel() * tensor.element_size())
        return tensor

    torch.manual_seed(1)  # the same dropout masks in both
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        loss = model(ids).logsumexp(-1).mean()
    loss.backward()
    return sum(saved), torch.cat([param.grad.flatten() for param in model.parameters()])


plain, plain_gradients = saved_bytes_and_gradients(False)
recomputed, gradients = saved_bytes_and_gradients(True)
print(plain, recomputed, float((gradients - plain_gradients).abs().max()))
"""


def test_activation_checkpointing_keeps_a_fraction_of_the_activations_and_the_same_gradients(lm):
    # The example's model.py names its 4 transformer layers in checkpoint_units: each keeps only its
    # input, and runs again in the backward pass, drawing the same dropout masks as the first time.
    result = run([sys.executable, "-c", RECOMPUTATION], cwd=lm, env={"PYTHONPATH": str(lm / "src")})
    assert result.returncode == 0, result.stdout[-3000:]
    plain, recomputed, difference = result.stdout.split()
    assert int(recomputed) < 0.15 * int(plain)  # measured: 0.071x
    assert float(difference) == 0.0


# checkpoint_units mistakes: what the function returns instead of the LM's layers, and what the run says.
UNITS_MISTAKES = {
    "return [nn.Linear(2, 2)]": "got a Linear that is not part of the model",
    "return [model.blocks.layers]": "got a ModuleList, which has no forward of its own: return the blocks in it",
    "return [*model.blocks.layers, model.blocks.layers[0]]": "got a TransformerEncoderLayer twice, or inside another",
    "pass": "got NoneType",  # a forgotten return
}


def test_activation_checkpointing_names_what_model_py_must_give(lm, tmp_path):
    no_units = copy_project(lm, tmp_path / "no_units")
    edit(no_units, "model.py", "def checkpoint_units(", "def my_blocks(")
    projects = [no_units]
    for index, mistake in enumerate(UNITS_MISTAKES):
        projects.append(copy_project(lm, tmp_path / f"mistake{index}"))
        edit(projects[-1], "model.py", "return list(model.blocks.layers)", mistake)
    flags = (*TINY_LM, "--activation-checkpointing")
    missing, *mistakes = in_parallel(
        *[lambda project=project: run_failing(project, project / "run", *flags) for project in projects]
    )
    assert missing.returncode == 2 and "Traceback" not in missing.stdout
    assert (
        "--activation-checkpointing recomputes the blocks that checkpoint_units(model) in model.py returns, and "
        "model.py has none; add it (docs/speed.md shows one), or train without the flag"
    ) in missing.stdout
    for result, message in zip(mistakes, UNITS_MISTAKES.values(), strict=True):
        assert result.returncode == 1 and "Traceback" not in result.stdout
        assert "model.py: checkpoint_units(model) must return a list of the model's blocks; " + message in result.stdout


def test_token_windows_train_alike_on_one_and_two_ranks_and_resume_exactly(lm, tmp_path):
    # docs/todos.md's token windows in the language model: windows at every offset of a token file,
    # epochs of 6 updates drawn from each epoch's shuffle, validation on 2 fixed batches of windows.
    # 1 rank, and 2 ranks stopped mid-epoch 2 then resumed, must train the same weights.
    project = copy_project(lm, tmp_path / "windows")
    write_blocks(project, doc_blocks("Token windows (GPT-style pretraining)"))
    flags = ("--epochs", "2", "--steps-per-epoch", "6", "--eval-batches", "2", "--eval-batch-size", "16")
    flags += ("--corpus-bytes", "60000", "--max-bytes", "32", "--width", "32", "--layers", "1", "--heads", "2")
    flags += ("--global-batch-size", "16", "--warmup-steps", "2", "--train-in-eval-mode")
    one, two = tmp_path / "one", tmp_path / "two"
    in_parallel(
        lambda: train_torch(project, one, *flags, "--data-dir", str(tmp_path / "data-one")),
        lambda: train_torch(
            project, two, *flags, "--data-dir", str(tmp_path / "data-two"), "--stop-after-step", "9", ranks=2
        ),
    )
    train_torch(project, two, *flags, "--data-dir", str(tmp_path / "data-two"), "--resume", ranks=2)
    assert relative_difference(trained_weights(one), trained_weights(two)) < LM_TOLERANCE
    assert [record["step"] for record in records(one)] == [record["step"] for record in records(two)] == [6, 12]
    assert all(record["val_tokens"] == 2 * 16 * 32 for record in records(one) + records(two))
    summary = json.loads((two / "summary.json").read_text())
    assert summary["val_loss"] == pytest.approx(records(one)[summary["best_epoch"] - 1]["val_loss"], rel=1e-5)
    assert sorted(path.name for path in (tmp_path / "data-one").iterdir()) == [
        "stdlib-60000-train.bin",
        "stdlib-60000-val.bin",
    ]


@pytest.fixture(scope="module")
def gan(tmp_path_factory) -> Path:
    return copy_project(GAN, tmp_path_factory.mktemp("gan") / "project")


GAN_RUN = ("--epochs", "2", "--global-batch-size", "64")


@pytest.fixture(scope="module")
def gan_one(gan, tmp_path_factory) -> Path:
    """The GAN trained on one process, uninterrupted: what two ranks and a resumed run must end like."""
    run_dir = tmp_path_factory.mktemp("gan-one") / "run"
    train_torch(gan, run_dir, *GAN_RUN)
    return run_dir


def test_gan_trains_both_networks_alike_on_two_ranks_with_accumulation(gan, gan_one, tmp_path):
    train_torch(gan, tmp_path / "two", *GAN_RUN, "--grad-accum-steps", "2", ranks=2)
    one, two = trained_weights(gan_one), trained_weights(tmp_path / "two")
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
    in_parallel(
        lambda: train_torch(naive, tmp_path / "one", *GAN_RUN),
        lambda: train_torch(naive, tmp_path / "two", *GAN_RUN, "--grad-accum-steps", "2", ranks=2),
    )
    assert (
        relative_difference(trained_weights(tmp_path / "one"), trained_weights(tmp_path / "two")) > 10 * GAN_TOLERANCE
    )


def test_gan_resume_from_a_step_checkpoint_with_two_optimizers_equals_an_uninterrupted_run(gan, gan_one, tmp_path):
    # 20 updates an epoch (1257 samples, 64 a batch): stopped after update 27, part-way through
    # epoch 2, with both networks' optimizers, schedulers and running losses in the checkpoint.
    train_torch(gan, tmp_path / "resumed", *GAN_RUN, "--stop-after-step", "27")
    resumed = train_torch(gan, tmp_path / "resumed", *GAN_RUN, "--resume")
    assert "resumed after update 27, part-way through epoch 2 (update 7 of 20)" in resumed.stdout
    assert relative_difference(trained_weights(gan_one), trained_weights(tmp_path / "resumed")) == 0
    assert records(gan_one) == [
        {**record, "epoch_time_s": records(gan_one)[index]["epoch_time_s"]}
        for index, record in enumerate(records(tmp_path / "resumed"))
    ]


@pytest.fixture(scope="module")
def tabular(tmp_path_factory) -> Path:
    """A ddp project filled with the dict-batch, two-input, F1 example of docs/todos.md."""
    project = tmp_path_factory.mktemp("tabular") / "tab"
    result = looptpl("new", str(project), "--backend", "torch", "--strategy", "ddp", "--no-git")
    assert result.exit_code == 0, result.stderr
    write_blocks(project, doc_blocks("Dict batches, two inputs, F1"))
    return project


def test_dict_batches_with_two_inputs_train(tabular, tmp_path):
    # 5 epochs: after 3, macro-F1 still varies from 0.46 to 0.54 with the seed (chance is about 0.33).
    train_torch(tabular, tmp_path, "--epochs", "5")
    logged = records(tmp_path)
    assert logged[-1]["train_loss"] < logged[0]["train_loss"] and logged[-1]["val_loss"] < logged[0]["val_loss"]
    assert logged[-1]["val_f1"] > 0.5 and logged[-1]["val_ids_in_order"] == 1.0


def test_a_non_decomposable_metric_is_exact_on_two_ranks(tabular, tmp_path):
    # --lr 0 keeps the weights equal, so the two runs must give the same predictions; the split
    # (251) is odd, so the ranks' shards differ in size and one rank runs a padding batch.
    flags = ("--epochs", "1", "--lr", "0", "--eval-batch-size", "16")
    in_parallel(
        lambda: train_torch(tabular, tmp_path / "one", *flags),
        lambda: train_torch(tabular, tmp_path / "two", *flags, ranks=2),
    )
    one, two = records(tmp_path / "one")[-1], records(tmp_path / "two")[-1]
    assert two["val_f1"] == one["val_f1"] and two["val_ids_in_order"] == one["val_ids_in_order"] == 1.0
    assert two["val_samples"] == 251


def test_steps_per_epoch_eval_batches_and_no_test_set_on_one_and_two_ranks_with_resume(tabular, tmp_path):
    # Epochs of 4 updates (--steps-per-epoch), each from its own shuffle of the train set; 1 and 2
    # ranks train the same updates. data.py gives no test set; --eval-batches 5 of 16 evaluates 80 of
    # the 251 val samples. metrics.py sees their ids, gathered from every rank: the same 80 (not the
    # first 80) at every evaluation, on 1 and 2 ranks. --monitor-mode max makes epoch 1 the best, before
    # the 2-rank run stops and resumes: the summary gives that epoch's val figures, which the checkpoint
    # must have kept.
    project = copy_project(tabular, tmp_path / "project")
    edit(project, "data.py", "for size in (600, 251, 257))", "for size in (600, 251)) + (None,)")
    code = '"id_code": float(hash(tuple(gathered["id"].tolist())) % 2**40), "ids_in_order"'
    edit(project, "metrics.py", '"ids_in_order"', code)
    in_parallel(
        lambda: train_torch(project, tmp_path / "one", *SUBSET_FLAGS),
        lambda: train_torch(project, tmp_path / "two", *SUBSET_FLAGS, "--stop-after-epoch", "2", ranks=2),
    )
    train_torch(project, tmp_path / "two", *SUBSET_FLAGS, "--resume", ranks=2)
    check_subset_runs(tmp_path, "val_id_code", "val_ids_in_order")


def test_a_frozen_teacher_gets_no_gradient_and_no_optimizer_state(tabular, tmp_path):
    train_torch(tabular, tmp_path / "teacher", "--epochs", "3")
    # The docs' recipe, copied verbatim, on ddp and on fsdp (FSDP reads model.py, which imports checkpoint.py).
    sharded = tmp_path / "sharded"
    assert looptpl("new", str(sharded), "--backend", "torch", "--strategy", "fsdp", "--no-git").exit_code == 0
    template_model = (sharded / "src" / "sharded" / "model.py").read_text()
    write_blocks(sharded, doc_blocks("Dict batches, two inputs, F1"))
    # FSDP's model.py also says how to shard: the template's default shard_units, kept.
    shard_units = template_model[template_model.index("def shard_units") :]
    write_blocks(sharded, {"model.py": shard_units}, append=("model.py",))
    for student in (copy_project(tabular, tmp_path / "student"), sharded):
        write_blocks(student, doc_blocks("Distillation"), append=("model.py",))
        edit(student, "optim.py", "AdamW(model.parameters()", 'AdamW(model["student"].parameters()')
    teacher = ("--teacher", str(tmp_path / "teacher" / "checkpoints" / "best.pt"))
    _, missing, _ = in_parallel(
        lambda: train_torch(tmp_path / "student", tmp_path / "run", "--epochs", "3", *teacher),
        lambda: run_failing(tmp_path / "student", tmp_path / "missing", "--teacher", str(tmp_path / "nope.pt")),
        lambda: train_torch(sharded, tmp_path / "sharded_run", "--epochs", "1", *teacher, ranks=2),
    )
    checkpoint = torch.load(sorted((tmp_path / "run" / "checkpoints").glob("epoch-*.pt"))[-1], weights_only=True)
    assert checkpoint["model"] and all(name.startswith("student.") for name in checkpoint["model"])
    assert all(name.startswith("student.") for name in checkpoint["optimizer"]["state"])
    logged = records(tmp_path / "run")
    assert logged[-1]["val_agreement"] > max(0.5, logged[0]["val_agreement"])  # it learns the teacher (3 classes)

    assert "cannot read frozen weights" in missing.stdout and "Traceback" not in missing.stdout


@pytest.mark.parametrize("gather", ["with-grad", "local-only"])
def test_a_contrastive_loss_over_every_rank_trains_like_one_rank(tabular, tmp_path, gather):
    project = copy_project(tabular, tmp_path / "contrastive")
    blocks = doc_blocks("Contrastive")
    write_blocks(project, {"step.py": blocks["step.py"], "metrics.py": blocks["metrics.py"]})
    write_blocks(
        project, {"data.py": blocks["data.py"], "model.py": blocks["model.py"]}, append=("data.py", "model.py")
    )
    if gather == "local-only":  # the naive version: each rank's negatives are its own samples only
        edit(project, "step.py", "gather_with_grad(second)", "(second, 0)")
    flags = ("--epochs", "2", "--global-batch-size", "32")
    in_parallel(
        lambda: train_torch(project, tmp_path / "one", *flags),
        lambda: train_torch(project, tmp_path / "two", *flags, ranks=2),
    )
    difference = relative_difference(trained_weights(tmp_path / "one"), trained_weights(tmp_path / "two"))
    if gather == "with-grad":
        assert difference < LM_TOLERANCE
    else:
        assert difference > 10 * LM_TOLERANCE


LAZY_FILE_DATA = '''
import os


class FromFile(Dataset):
    """Items read from one binary file, opened on first use in the process that reads (each worker its own)."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size, self.handle, self.opened_by = path, size, None, 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.handle is None:
            self.handle, self.opened_by = open(self.path, "rb"), os.getpid()  # noqa: SIM115
        if self.opened_by != os.getpid():  # inherited from the process that forked this worker: shared offsets
            raise RuntimeError("a file handle opened in another process is read here")
        self.handle.seek(index * 4 * (NUM_FEATURES + 1))
        row = torch.frombuffer(bytearray(self.handle.read(4 * (NUM_FEATURES + 1))), dtype=torch.float32)
        return row[:NUM_FEATURES], row[NUM_FEATURES].long()


_build_datasets = build_datasets


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset]:
    train, val, test = _build_datasets(config)
    path = f"{config.run_dir}.train.bin"
    torch.cat([train.tensors[0], train.tensors[1][:, None].float()], dim=1).numpy().tofile(path)
    return FromFile(path, len(train)), val, test
'''


def test_a_lazily_opened_file_gives_the_same_run_with_and_without_workers(tmp_path):
    # The engine reads no item before the DataLoader workers start, so each worker opens its own
    # handle; a handle opened (or a file read) in the main process first would be shared by every
    # worker, and their seeks and reads would interleave.
    project = tmp_path / "lazy"
    assert looptpl("new", str(project), "--backend", "torch", "--strategy", "single", "--no-git").exit_code == 0
    (project / "src" / "lazy" / "data.py").write_text(
        (project / "src" / "lazy" / "data.py").read_text() + LAZY_FILE_DATA
    )
    workers = ("--epochs", "2", "--num-workers")
    in_parallel(
        lambda: train_torch(project, tmp_path / "run0", *workers, "0"),
        lambda: train_torch(project, tmp_path / "run1", *workers, "2"),
        lambda: train_torch(project, tmp_path / "run2", *workers, "2"),
    )
    weights = [trained_weights(run_dir) for run_dir in sorted(tmp_path.glob("run?"))]
    assert relative_difference(weights[0], weights[1]) == 0 and relative_difference(weights[0], weights[2]) == 0


PREPARED_DATA = """
import os
import time
from pathlib import Path


def prepare_data(config: TrainConfig) -> None:
    if Path(f"{config.run_dir}.fail").exists():
        raise ValueError("the corpus is missing")
    time.sleep(3)  # slow, as tokenizing is: a rank that did not wait would read before the file exists
    with open(f"{config.run_dir}.prepared", "a") as prepared:
        prepared.write(f"prepared by rank {os.environ.get('RANK', '0')}\\n")


_build_datasets = build_datasets


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset, Dataset]:
    Path(f"{config.run_dir}.prepared").read_text()  # what prepare_data made
    return _build_datasets(config)
"""


def test_data_is_prepared_once_per_machine_while_the_other_ranks_wait(tmp_path):
    project = tmp_path / "prep"
    assert looptpl("new", str(project), "--backend", "torch", "--strategy", "ddp", "--no-git").exit_code == 0
    data = project / "src" / "prep" / "data.py"
    data.write_text(data.read_text() + PREPARED_DATA)
    train_torch(project, tmp_path / "run", "--epochs", "1", ranks=2)
    assert Path(f"{tmp_path / 'run'}.prepared").read_text() == "prepared by rank 0\n"

    # A failure there stops every rank, in one line each, without waiting for a timeout.
    Path(f"{tmp_path / 'failing'}.fail").touch()
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "prep.train"]
    flags = ["--run-dir", str(tmp_path / "failing"), "--device", "cpu", "--no-progress"]
    failed = run([*launch, *flags], cwd=project, env={"PYTHONPATH": str(project / "src")}, timeout=120)
    assert failed.returncode != 0
    assert re.search(r"error: data\.py:\d+ failed in prepare_data: ValueError: the corpus is missing", failed.stdout)
    assert "prepare_data failed on another rank; its log says why" in failed.stdout


FROZEN_BACKBONE = """

_build_model = build_model


def build_model(config: TrainConfig) -> nn.Module:
    model = _build_model(config)
    model[0].requires_grad_(False)  # the first layer, a "backbone", starts frozen
    return model
"""
UNFREEZING_HOOKS = """
class Hooks:
    def __init__(self, config: TrainConfig) -> None:
        self.config = config

    def on_epoch_start(self, run: Run, epoch: int) -> None:
        network = getattr(run.models, "module", run.models)  # DDP holds the network as .module
        network[0].requires_grad_(epoch > 1)  # the backbone trains from epoch 2 on
"""


def test_a_hook_may_unfreeze_weights_except_under_ddp_on_several_ranks(tmp_path):
    projects = {}
    for strategy in ("ddp", "fsdp"):
        project = projects[strategy] = tmp_path / strategy
        assert looptpl("new", str(project), "--backend", "torch", "--strategy", strategy, "--no-git").exit_code == 0
        for file, extra in (("model.py", FROZEN_BACKBONE), ("hooks.py", UNFREEZING_HOOKS)):
            path = project / "src" / strategy / file
            path.write_text(path.read_text() + extra)
    flags = ("--epochs", "2")
    train_torch(projects["ddp"], tmp_path / "one", *flags)  # one process: the model is not wrapped
    train_torch(projects["fsdp"], tmp_path / "fsdp-two", *flags, ranks=2)  # FSDP follows the change
    assert relative_difference(trained_weights(tmp_path / "one"), trained_weights(tmp_path / "fsdp-two")) < 1e-5
    # DDP on two ranks would leave the unfrozen layer unsynchronized, each rank training it its own way:
    # the run stops instead, saying what to do.
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ddp.train"]
    flags_ddp = ["--run-dir", str(tmp_path / "ddp-two"), "--device", "cpu", "--no-progress", *flags]
    stopped = run(
        [*launch, *flags_ddp], cwd=projects["ddp"], env={"PYTHONPATH": str(projects["ddp"] / "src")}, timeout=120
    )
    assert stopped.returncode != 0
    assert "changed which weights train (requires_grad) after DDP wrapped the model" in stopped.stdout
    assert "learning rate of 0 in optim.py's param groups instead, or use fsdp" in stopped.stdout


OWN_OPTIMIZER = """

class WithOptimizer(nn.Sequential):
    def configure_optimizers(self, lr: float) -> torch.optim.Optimizer:
        # nanoGPT's pattern: weight decay on the matrices only.
        matrices = [param for param in self.parameters() if param.dim() >= 2]
        others = [param for param in self.parameters() if param.dim() < 2]
        groups = [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr)


_build_model = build_model


def build_model(config: TrainConfig) -> nn.Module:
    return WithOptimizer(*_build_model(config))
"""


def test_optim_py_gets_the_model_as_built_so_its_own_methods_work_on_every_strategy(tmp_path):
    """optim.py calls the model's configure_optimizers (nanoGPT's way): under DDP the model it gets
    must be model.py's, not the wrapper (which has no such method); every strategy trains alike."""
    projects = {}
    for strategy in ("ddp", "fsdp"):
        project = projects[strategy] = tmp_path / strategy
        assert looptpl("new", str(project), "--backend", "torch", "--strategy", strategy, "--no-git").exit_code == 0
        model_py, optim_py = (project / "src" / strategy / name for name in ("model.py", "optim.py"))
        model_py.write_text("import torch\n" + model_py.read_text() + OWN_OPTIMIZER)
        own = "    return model.configure_optimizers(config.lr)\n"
        optim_py.write_text(re.sub(r"    return torch\.optim\.AdamW\(.*\)\n", own, optim_py.read_text()))
        assert own in optim_py.read_text()
    flags = ("--epochs", "2")
    in_parallel(
        lambda: train_torch(projects["ddp"], tmp_path / "one", *flags),
        lambda: train_torch(projects["ddp"], tmp_path / "ddp-two", *flags, ranks=2),
        lambda: train_torch(projects["fsdp"], tmp_path / "fsdp-two", *flags, ranks=2),
    )
    reference = trained_weights(tmp_path / "one")
    for name in ("ddp-two", "fsdp-two"):
        assert relative_difference(reference, trained_weights(tmp_path / name)) < 1e-5, name


COUNTED_SUMS = """

import sys
from pathlib import Path

from . import distributed

_start_sum, SUMS = distributed.start_sum, []


def _counted(tensor):
    SUMS.append(sys._getframe(1).f_code.co_name == "exact_factor")  # True: an update's sum of the loss weight
    return _start_sum(tensor)


distributed.start_sum = _counted
_Hooks = Hooks


class Hooks(_Hooks):
    def on_run_end(self, run, summary):
        if run.is_main:
            (Path(self.config.run_dir) / "weight_sums").write_text(str(sum(SUMS)))
"""
WEIGHTED = "    return Mean(losses := per_sample_loss(model(inputs), targets), weights=torch.ones_like(losses))"
DOUBLED = "    return Mean(torch.cat([losses := per_sample_loss(model(inputs), targets), losses]))"
DROPPING = """    losses = per_sample_loss(model(inputs), targets)
    global CALLS
    CALLS = globals().get("CALLS", 0) + 1
    return Mean(losses[1:] if CALLS > 4 else losses)  # from the third update, one sample left out"""


def test_an_unweighted_losses_weight_is_counted_not_summed_over_the_ranks(tmp_path):
    """An unweighted loss of k values per sample weighs k x the update's samples, which the sampler gives every
    rank: after the ranks agree on k in the first update's sum, no update sums W (a hand-written loop sums
    nothing), and two ranks with accumulation and a short last batch still train like one, for k = 1 and 2. A
    weighted loss sums W at every update (the count would catch a loop that sums always); a loss whose count
    stops being k per sample is refused, not trained on with a wrong W."""
    project = tmp_path / "project"
    assert looptpl("new", str(project), "--backend", "torch", "--strategy", "ddp", "--no-git").exit_code == 0
    package = project / "src" / "project"
    (package / "hooks.py").write_text((package / "hooks.py").read_text() + COUNTED_SUMS)
    default = "    return Mean(per_sample_loss(model(inputs), targets))"
    edits = {"weighted": WEIGHTED, "doubled": DOUBLED, "dropping": DROPPING}
    for name, step in edits.items():
        copy_project(project, tmp_path / name)
        edit(tmp_path / name, "step.py", default, step)
        edit(tmp_path / name, "step.py", "from torch import nn", "import torch\nfrom torch import nn")
    flags = ("--epochs", "2", "--grad-accum-steps", "2")  # 1,003 samples: 16 updates an epoch, the last of 43
    dropping = tmp_path / "dropping"
    in_parallel(
        lambda: train_torch(project, tmp_path / "one", *flags),
        lambda: train_torch(project, tmp_path / "two", *flags, ranks=2),
        lambda: train_torch(tmp_path / "doubled", tmp_path / "two-doubled", *flags, ranks=2),
    )
    _, dropped = in_parallel(
        lambda: train_torch(tmp_path / "weighted", tmp_path / "two-weighted", *flags, ranks=2),
        lambda: run(
            [sys.executable, "-m", "project.train", "--run-dir", str(tmp_path / "dropped"), "--device", "cpu", *flags],
            cwd=dropping,
            env={"PYTHONPATH": str(dropping / "src"), "OMP_NUM_THREADS": "1"},
            preload=TORCH,
            ranks=2,
        ),
    )
    one = trained_weights(tmp_path / "one")
    for name in ("two", "two-doubled"):
        assert relative_difference(one, trained_weights(tmp_path / name)) < 1e-5, name
        assert (tmp_path / name / "weight_sums").read_text() == "1", name  # the first update's, which agrees
    assert (tmp_path / "two-weighted" / "weight_sums").read_text() == "32"
    assert dropped.returncode == 1 and not (tmp_path / "dropped" / "weight_sums").exists()
    refused = "error: train_step's loss for 'model' gave 1 per sample (unweighted) at first, not now"
    assert refused in dropped.stdout, dropped.stdout[-3000:]
