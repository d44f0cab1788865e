"""The one way a command stops on bad input: raise `CommandError`; the command group (cli
`__init__`) prints its line and exits with its status.

A verb deep in a helper cannot know whether it runs under `main` or is called by another verb,
so it does not print and exit itself; it raises, and the group, which runs every verb, is the
one place that turns the error into "error: ..." on stderr and an exit status. Usage mistakes
(a bad option value) stay click's own `BadParameter`/`UsageError`: click prints those with
the usage line. The class lives in npumem.errors (the ground floor: estimate raises it too)."""

from __future__ import annotations

from ..errors import CommandError

__all__ = ["CommandError"]
