# Settings baked into the optimizer, the schedule or the data order: a resumed run must keep them.
OPTIMIZER_SETTINGS = ("lr", "weight_decay", "schedule", "warmup_steps", "min_lr", "ema_decay")
FIXED_FOR_A_RUN = (*OPTIMIZER_SETTINGS, "global_batch_size", "steps_per_epoch", "seed")


def check_min_lr(config: TrainConfig, where: dict[str, str]) -> None:
    """Refuse a --min-lr the schedule cannot end at (`where` names each setting as the user gave it)."""
    if config.min_lr > config.lr:
        raise ConfigError(
            f"{where['min_lr']} {config.min_lr} is above {where['lr']} {config.lr}: the schedule decays from "
            f"{where['lr']} down to {where['min_lr']}"
        )
    if config.min_lr and config.schedule != "cosine":
        schedule = f"{where['schedule']} {config.schedule}"
        raise ConfigError(f"{where['min_lr']} is where the cosine schedule ends; {schedule} has none")


def check_resumable(config: TrainConfig, saved: dict[str, object]) -> None:
    """Refuse to resume with settings that would make the rest of the run differ from the start."""
    changed = [
        f"--{flag(name)} {getattr(config, name)} (the run used {saved[name]})"
        for name in FIXED_FOR_A_RUN
        if name in saved and saved[name] != getattr(config, name)
    ]
    if changed:
        raise ConfigError(
            f"cannot resume with a changed {', '.join(changed)}; pass the run's values, or start a new --run-dir"
        )


def flag(name: str) -> str:
    """The command-line spelling of a field name."""
    return name.replace("_", "-")


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Build the config from the command line (every field is a flag) and validate it.

    settings.py's DEFAULTS replace the template's defaults, a --config file replaces those, and a flag
    given on the command line wins. A mistake is one line naming its flag, or its file and key.
    """
    parser = FlagParser(
        prog=f"python -m {__name__.rsplit('.', 2)[0]}.train",  # this project's package: PKG.kit.config's PKG
        usage="%(prog)s [flags]",
        description="Train the model. Every flag is also a key of a --config file; yours (settings.py) come first.",
        formatter_class=ShowDefaults,
        allow_abbrev=False,
    )
    types = typing.get_type_hints(TrainConfig)
    # The --config file first: its values become the defaults that the other flags override.
    config_file = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    config_file.add_argument("--config", default="")
    path = config_file.parse_known_args(argv)[0].config
    try:  # mistakes in files: one line, without the usage block that argparse adds for the flags
        from_file, places = read_config_file(path, types) if path else ({}, {})
        if clashes := [name for name in Settings.__dataclass_fields__ if name in TrainConfig.__annotations__]:
            raise ConfigError(f"settings.py: {', '.join(clashes)} is a flag of the template already; rename it")
        if unknown := [name for name in DEFAULTS if name not in TrainConfig.__dataclass_fields__]:
            raise ConfigError(f"settings.py: DEFAULTS names {', '.join(unknown)}, which is no flag (see --help)")
    except ConfigError as error:
        parser.exit(2, f"error: {error}\n")
    template_fields = set(TrainConfig.__dataclass_fields__) - set(Settings.__dataclass_fields__)
    for item in dataclasses.fields(TrainConfig):
        kind, help_text = types[item.name], item.metadata.get("help", "")
        default = from_file.get(item.name, DEFAULTS.get(item.name, item.default))
        if item.name in DEFAULTS and item.name in template_fields:
            help_text += " (settings.py sets the default)"
        if kind is bool:
            parser.add_argument(
                f"--{flag(item.name)}", action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
        elif typing.get_origin(kind) is Literal:
            parser.add_argument(f"--{flag(item.name)}", choices=typing.get_args(kind), default=default, help=help_text)
        else:
            parser.add_argument(f"--{flag(item.name)}", type=_number(kind), default=default, help=help_text)
    config = TrainConfig(**vars(parser.parse_args(argv)))
    try:  # a value the file set (and no flag replaced) is named as the file's key: base.toml: epochs
        config.validate({name: place for name, place in places.items() if getattr(config, name) == from_file[name]})
    except ConfigError as error:
        parser.exit(2, f"error: {error}\n")
    return config


class FlagParser(argparse.ArgumentParser):
    """argparse, with a mistake reported once under torchrun (by rank 0, and to torchrun's error file)."""

    def error(self, message: str) -> typing.NoReturn:
        if first_rank():
            self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}\n")

    def exit(self, status: int = 0, message: str | None = None) -> typing.NoReturn:
        if message and status:
            report(message)
        elif message:
            print(message, end="")
        sys.exit(status)


class ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help gives each flag's default (as settings.py or a --config file set it), except an empty one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in ("", None):
            return action.help
        return super()._get_help_string(action)


def _number(kind: type) -> typing.Callable[[str], object]:
    """int, float or str parsing, where floats refuse nan and inf (`--lr nan` would silently train nothing)."""
    if kind is not float:
        return kind

    def finite_float(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(text)
        return value

    finite_float.__name__ = "finite float"
    return finite_float
