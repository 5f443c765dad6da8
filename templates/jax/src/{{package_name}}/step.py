"""Your step: how a batch trains and evaluates your model.

This file is yours: `copier update` keeps your edits here.

The loop traces `train_step` once per micro-batch shape, inside one compiled update, and
`eval_step` once per evaluation batch shape. Return values to average (`Mean`) and the loop does
the rest: it averages them over the whole global batch (every device and micro-step), takes the
gradient, clips and steps. Write them as for one device: the arrays are global.

With several optimizers (a dict in optim.py, a GAN's), `train_step` yields one `name, Mean(...)` per
optimizer, in the dict's order; each stage's loss sees the weights the stages before it updated.
"""

from typing import Any

from flax import nnx

from .kit.api import Gather, Mean, evaluation
from .kit.config import TrainConfig
from .loss import per_sample_loss
from .metrics import batch_metrics


def train_step(model: nnx.Module, batch: Any, config: TrainConfig) -> Mean:
    """The loss of one micro-batch, as a `Mean` of per-sample (or per-token) values."""
    # TODO(step): call your model the way it takes your batch; here a batch is an (inputs, targets) pair.
    inputs, targets = batch
    return Mean(per_sample_loss(model(inputs), targets))


def eval_step(model: nnx.Module, batch: Any, config: TrainConfig) -> dict[str, Mean | Gather]:
    """The loss and metrics of one evaluation batch; logged as val_<name> and test_<name>."""
    inputs, targets = batch
    logits = model(inputs)
    return evaluation(loss=Mean(per_sample_loss(logits, targets)), metrics=batch_metrics(logits, targets))
