Schedule = TypeVar("Schedule")


def check_floor(schedule: Schedule, min_lr: float) -> Schedule:
    """The schedule optim.py built, refused if it is the template's and does not end at --min-lr:
    an optim.py written before that flag existed does not pass it on, and the flag would change nothing."""
    floor = getattr(schedule, "min_lr", min_lr)  # a schedule of your own has none: yours to use --min-lr
    if floor != min_lr:
        raise DataError(
            f"optim.py: the template's schedule ends at min_lr={floor}, but --min-lr is {min_lr}: "
            "pass min_lr=config.min_lr where optim.py builds it"
        )
    return schedule
