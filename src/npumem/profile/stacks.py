"""Python stacks of the code that allocated, captured cheaply and resolved only when reported.

Capture keeps (code object, line) pairs — no strings are built on the hot path — and skips
npumem's own frames, so the innermost frame is the user's line that asked for memory.
"""

from __future__ import annotations

import bisect
import os
import sys
from typing import NamedTuple

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNPY = "<frozen runpy>"          # how `npumem profile` runs a script: not the user's code
# Test runners that call the user's code: a stack ends where they begin, as it does at npumem.
_RUNNERS = (f"{os.sep}_pytest{os.sep}", f"{os.sep}pluggy{os.sep}")
_internal_code: dict = {}          # code object -> npumem or a runner of the user's code (cache)
# npumem's files that stand in for a library's function inside the user's stack (npumem
# estimate's scaled_dot_product_attention): a stack goes on through them, as through the library
_pass_through: set = set()


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
        internal = _internal_code[code] = name not in _pass_through and (
            is_internal_file(name) or name.startswith(_RUNPY)
            or any(runner in name for runner in _RUNNERS))
    return internal


def pass_through(*filenames: str) -> None:
    """Let stacks go on through these npumem files (their frames are kept, as a library's are,
    and reports pass over them to the user's line): code that stands in for a library's."""
    _pass_through.update(os.path.abspath(name) for name in filenames)
    _internal_code.clear()


def capture(limit: int, skip: int = 0) -> tuple:
    """Up to `limit` user frames, innermost first, as one flat tuple (code, offset, code, offset,
    ...) — the instruction offset, not the line: computing a line number decodes the code's line
    table, so that waits for `resolve`. One tuple per stack keeps the garbage collector's work
    small. The stack ends where npumem's own code is reached again (e.g. `npumem profile`
    running the script). `skip`: callers known to be npumem's, passed over without building
    their frame objects (Python 3.11+ builds one for each frame a walk through f_back touches)."""
    internal = _internal_code
    try:
        frame = sys._getframe(1 + skip)
    except ValueError:
        return ()
    while frame is not None:
        code = frame.f_code
        flag = internal.get(code)
        if flag is None:
            flag = _internal(code)
        if not flag:
            break
        frame = frame.f_back
    frames: list = []
    append = frames.append
    while frame is not None and limit:
        code = frame.f_code
        flag = internal.get(code)
        if flag is None:
            flag = _internal(code)
        if flag:
            break
        append(code)
        append(frame.f_lasti)
        limit -= 1
        frame = frame.f_back
    return tuple(frames)


def capture_above(skip: int, limit: int) -> tuple:
    """The stack above the caller's `skip` innermost frames, up to `limit` frames, raw as
    `capture` gives it, without looking at any frame: for hooks whose own frames are known.
    `resolve_user` drops what runs the user's code (npumem's runner, runpy) at its outer end."""
    try:
        frame = sys._getframe(1 + skip)
    except ValueError:
        return ()
    frames: list = []
    append = frames.append
    while frame is not None and limit:
        append(frame.f_code)
        append(frame.f_lasti)
        limit -= 1
        frame = frame.f_back
    return tuple(frames)


def resolve_user(raw: tuple | None) -> tuple[Frame, ...]:
    """`resolve`, ending where npumem's own code (its runner) is reached again."""
    codes = raw[::2] if raw else ()
    end = next((i for i, code in enumerate(codes) if _internal(code)), len(codes))
    return resolve(raw[:2 * end]) if end else ()


_line_tables: dict = {}            # code object -> (range starts, [(start, end, line)])


def line_of(code, offset: int) -> int:
    """The source line of the instruction at byte `offset` of `code`."""
    table = _line_tables.get(code)
    if table is None:
        ranges = [r for r in code.co_lines() if r[2] is not None]
        table = _line_tables[code] = ([r[0] for r in ranges], ranges)
    starts, ranges = table
    i = bisect.bisect_right(starts, offset) - 1
    return ranges[i][2] if i >= 0 and offset < ranges[i][1] else code.co_firstlineno


def resolve(raw: tuple | None) -> tuple[Frame, ...]:
    if not raw:
        return ()
    return tuple(Frame(_tidy(code.co_filename), line_of(code, offset),
                       getattr(code, "co_qualname", code.co_name))
                 for code, offset in zip(raw[::2], raw[1::2]))


def _tidy(filename: str) -> str:
    """A script run as `python ../train.py` names itself so: drop the `..`."""
    return os.path.normpath(filename) if f"{os.sep}.." in filename else filename


# npumem's files that play a user's program: their lines are the allocation sites.
_USER_FILES = (_PACKAGE_DIR + "demo.py",)


def is_internal_file(filename: str) -> bool:
    return filename.startswith(_PACKAGE_DIR) and not filename.startswith(_USER_FILES)
