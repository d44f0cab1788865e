"""Python stacks of the code that allocated, captured cheaply and resolved only when reported.

Capture keeps (code object, line) pairs — no strings are built on the hot path — and skips
npumem's own frames, so the innermost frame is the user's line that asked for memory.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNPY = "<frozen runpy>"          # how `npumem profile` runs a script: not the user's code
_internal_code: dict = {}          # code object -> lives inside npumem (cache)


class Frame(NamedTuple):
    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line} in {self.name}"

    def as_dict(self) -> dict:
        """PyTorch's snapshot frame structure."""
        return {"filename": self.filename, "line": self.line, "name": self.name}


def _internal(code) -> bool:
    internal = _internal_code.get(code)
    if internal is None:
        name = code.co_filename
        internal = _internal_code[code] = name.startswith(_PACKAGE_DIR) or name.startswith(_RUNPY)
    return internal


def capture(limit: int) -> tuple:
    """Up to `limit` user frames, innermost first, as (code, line) pairs. The stack ends where
    npumem's own code is reached again (e.g. `npumem profile` running the script)."""
    frame = sys._getframe(1)
    while frame is not None and _internal(frame.f_code):
        frame = frame.f_back
    frames = []
    while frame is not None and len(frames) < limit and not _internal(frame.f_code):
        frames.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(frames)


def resolve(raw: tuple | None) -> tuple[Frame, ...]:
    if not raw:
        return ()
    return tuple(Frame(code.co_filename, line, code.co_qualname if hasattr(code, "co_qualname")
                       else code.co_name) for code, line in raw)


def is_internal_file(filename: str) -> bool:
    return filename.startswith(_PACKAGE_DIR)
