"""The one exception type for problems the user can fix; the CLI turns it into a message and an exit code."""


class LooptplError(Exception):
    """A problem with the user's input or environment; the message names it and the fix."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
