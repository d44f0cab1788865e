"""The one way a command stops on bad input: raise `CommandError`; the command group (cli
`__init__`) prints its line and exits with its status.

A verb deep in a helper cannot know whether it runs under `main` or is called by another verb,
so it does not print and exit itself; it raises, and the group, which runs every verb, is the
one place that turns the error into "error: ..." on stderr and an exit status. Usage mistakes
(a bad option value) stay click's own `BadParameter`/`UsageError`: click prints those with
the usage line."""

from __future__ import annotations


class CommandError(Exception):
    """The command cannot go on: `message` is the line the user reads (without "error: "),
    `exit_code` the status the command ends with (2: bad input, the default)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message
