"""--jit-compile: XLA compiles each micro-step whole, and what it cannot compile is named in one line.

Managed by the looptpl template: put your own code in step.py and model.py.
"""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf

from .errors import ConfigError, StepError, in_your_files
from .stages import Stage

# How XLA refuses a graph: an op without an XLA kernel, or a shape computed from the data.
NO_KERNEL = r"(\w+) \(No registered '\w+' OpKernel for XLA"
DATA_DEPENDENT = r"^.*must be a compile-time constant.*$"


def compile_micro_step(micro_step: Callable[[Any], Any], stages: list[Stage]) -> Callable[[Any], Any]:
    """`micro_step` (a micro-batch's forward and backward pass) compiled by XLA into fused kernels.

    The loop, the sums over replicas and the update stay in the graph around it: XLA compiles what
    runs on one replica. With several optimizers, step.py's generator is resumed after each one's
    update, so a micro-step is no longer one function XLA could compile.
    """
    if len(stages) > 1:
        names = ", ".join(stage.name for stage in stages)
        raise ConfigError(
            f"--jit-compile compiles the step of one optimizer, and optim.py builds {len(stages)} ({names}); "
            "train without --jit-compile"
        )
    return tf.function(micro_step, jit_compile=True, autograph=False)  # plain Python: see train.py's _update


def xla_error(error: tf.errors.InvalidArgumentError) -> Exception:
    """One line for what XLA could not compile in the train step, naming your line; any other error as it is."""
    message = str(error)
    unsupported = sorted(set(re.findall(NO_KERNEL, message)))
    shape = re.search(DATA_DEPENDENT, message, flags=re.MULTILINE)
    if unsupported:
        problem = f"XLA cannot compile {', '.join(unsupported)}"
        fix = "replace what creates it"
    elif shape:
        problem = f"{shape[0].strip().rstrip('.')}: XLA needs shapes that do not depend on the data"
        fix = "compute that shape from the batch's shape"
    else:
        return error
    return StepError(f"--jit-compile: {where_in_your_code(message)}{problem}; {fix}, or train without --jit-compile")


def where_in_your_code(message: str) -> str:
    """`step.py:36: `, the last line of your files in the stack trace of the op XLA refused; or nothing."""
    # Ops created on a replica's thread (mirrored, multi-worker) list their files without the leading "/".
    places = re.findall(r'File "([^"]+)", line (\d+)', message)
    frames = [(Path("/" + name.lstrip("/")), int(line)) for name, line in places]
    mine = in_your_files(frames)
    return mine[-1] + ": " if mine else ""
