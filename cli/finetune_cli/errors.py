"""The one exception CLI commands raise for a user-facing failure."""


class CliError(Exception):
    """A failure the user can act on; printed as one line, never as a traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
