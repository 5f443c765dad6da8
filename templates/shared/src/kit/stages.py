def micro_step_losses(
    train_step: Callable[[Any, Any, TrainConfig], Any], models: Any, batch: Any, config: TrainConfig, first: str
) -> Iterator[tuple[str, Mean]]:
    """step.py's losses for one micro-batch, one per stage: a returned `Mean` is the first stage's,
    a generator yields (name, Mean) pairs. Nothing runs before the first loss is asked for."""
    result = train_step(models, batch, config)
    if isinstance(result, Iterator):
        yield from result
    else:
        yield first, result


def next_loss(losses: Iterator[tuple[str, Mean]], stage: Stage, stages: list[Stage]) -> Mean:
    """The loss that `stage` trains on from a micro-batch's `micro_step_losses`, checked."""
    try:
        given = next(losses)
    except StopIteration:
        raise StepError(f"train_step yielded no loss for optimizer {stage.name!r} of optim.py") from None
    except Exception as error:
        raise user_code_error(error, "in train_step") from None
    if not (isinstance(given, tuple) and len(given) == 2) or (len(stages) > 1 and given[0] != stage.name):
        names = [stage.name for stage in stages]
        raise StepError(f"train_step must yield (name, Mean) pairs for the optimizers {names}, in that order")
    return check_train_value(given[1], stage.name)


def check_all_used(steps: list[Iterator[tuple[str, Mean]]], stages: list[Stage]) -> None:
    """A step that yields more losses than there are optimizers has a loss nothing trains on."""
    for losses in steps:
        if next(losses, None) is not None:
            raise StepError(f"train_step yielded more losses than optim.py has optimizers ({len(stages)})")
