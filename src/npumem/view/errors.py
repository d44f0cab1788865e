"""The viewer's two errors, below every module that raises them: a path it cannot open
(`SourceError`: the command prints its line and exits 2) and a request it cannot answer
(`RequestError`: the page shows its line, with a 4xx status)."""

from __future__ import annotations


class SourceError(ValueError):
    """A path the viewer cannot open: the message is the line the user reads."""


class RequestError(ValueError):
    """A request the server cannot answer: its line, and the HTTP status (400 unless said)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
