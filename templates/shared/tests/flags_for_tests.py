@functools.cache
def flags_for_tests() -> tuple[str, ...]:
    """settings.py's TEST_DEFAULTS as flags: every test run gets them, before the test's own flags."""
    from {{ package_name }} import settings  # imported here, once src/ is on the path
    from {{ package_name }}.kit.config import TrainConfig

    flags: list[str] = []
    for name, value in getattr(settings, "TEST_DEFAULTS", {}).items():  # a settings.py from before it has none
        if name not in TrainConfig.__dataclass_fields__:
            raise ValueError(f"settings.py: TEST_DEFAULTS names {name}, which is no flag (see --help)")
        option = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{option}" if value else f"--no-{option}")
        else:
            flags += [f"--{option}", str(value)]
    return tuple(flags)
