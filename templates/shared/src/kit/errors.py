def three_datasets(returned: object) -> tuple[Any, Any, Any]:
    """data.py's (train, val, test; the test set may be None), or a DataError saying what build_datasets
    returned instead."""
    if isinstance(returned, tuple | list) and len(returned) == 3:
        missing = [split for split, dataset in zip(("train", "val"), returned, strict=False) if dataset is None]
        if missing:
            raise DataError(
                f"data.py: build_datasets returned None for the {missing[0]} set; only the test set may be None "
                "(the run then has no final test)"
            )
        return returned[0], returned[1], returned[2]
    if returned is None:
        got = "None"
    elif isinstance(returned, tuple | list | dict):
        got = f"a {type(returned).__name__} of {len(returned)}"
    else:
        got = f"a {type(returned).__name__}"
    raise DataError(f"data.py: build_datasets must return (train, val, test) datasets, got {got}")


class in_your_code:
    """Around a call of your code (build_model, build_optimizer, ...): an exception raised in one of your
    files becomes one line naming its file and line, `optim.py:22 failed building the optimizer: ...`.

    `hint` ends that line when the error is about a dict: code written for one model, given several.
    A class, not a generator: it wraps train_step at every micro-step, and costs a third as much.
    """

    def __init__(self, doing: str, hint: str = "") -> None:
        self.doing, self.hint = doing, hint

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        if not isinstance(error, Exception):
            return  # no exception, or Ctrl-C and the like: left as they are
        problem = user_code_error(error, self.doing)
        if problem is error:
            return  # one of ours, with no file of yours on its way: it goes on as it is
        if self.hint and re.search(r"\bdict\b", str(problem)):
            problem = type(problem)(f"{problem}; {self.hint}")
        raise problem from None


def first_rank() -> bool:
    """Whether this process speaks for all: rank 0 under torchrun (or worker 0 of TensorFlow's
    kit/launch.py, which numbers its workers alike), or a process on its own."""
    return os.environ.get("RANK", "0") == "0"


def report(message: str, every_rank: bool = True) -> None:
    """Print the line that ends a failed run, once: from rank 0 when every rank stops alike, from the
    rank it happened on otherwise. Under torchrun it also goes into the rank's error file, which
    torchrun's closing summary quotes as the root cause (instead of `error_file: <N/A>`)."""
    line = message.strip().splitlines()[-1] if message.strip() else message
    if not every_rank or first_rank():
        # One write, newline included: lines from ranks failing at once are not glued together.
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
    if error_file := os.environ.get("TORCHELASTIC_ERROR_FILE"):
        with contextlib.suppress(OSError):
            Path(error_file).write_text(json.dumps({"message": line, "timestamp": int(time.time())}))
        if every_rank and not first_rank():
            _wait_for_the_first_local_rank(Path(error_file))


def _wait_for_the_first_local_rank(error_file: Path) -> None:
    """Wait (10 s at most) until local rank 0 has written its error file, so has printed its line.

    torchrun stops every rank as soon as one exits: leaving first, this rank could stop rank 0 before it
    says why, a mistake found before the ranks join (at import, in a flag) leaving no line at all.
    """
    if error_file.parent.name != os.environ.get("LOCAL_RANK"):
        return  # not torchrun's layout (ATTEMPT/LOCAL_RANK/error.json): nothing to wait for
    first = error_file.parent.parent / "0" / error_file.name
    deadline = time.monotonic() + 10.0
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
