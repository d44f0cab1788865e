"""Files the commands write: checked before the work starts, written whole or not at all.

A command that runs for minutes must not fail on its output path at the end, and a convert that
fails half-way (or is interrupted) must leave neither a partial file nor a damaged original:
output goes to a temporary file beside the target and is renamed over it once complete.
"""

from __future__ import annotations

import contextlib
import os


class OutputPathError(ValueError):
    """An output path that cannot be written; the message says why."""


def check_output(path: str, source: str | None = None) -> None:
    """Refuse, before any work, an output that cannot be written or that is `source` itself
    (the same path, a symbolic link to it or a hard link)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise OutputPathError(f"cannot write {path}: it is a folder; give a file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OutputPathError(f"cannot write {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise OutputPathError(f"cannot write {path}: the folder {folder} is not writable")
    if source is not None and os.path.exists(path) and os.path.exists(source) \
            and os.path.samefile(source, path):
        raise OutputPathError(f"{path} is the input file {source} itself (or a link to it); "
                              "writing it would destroy the input: choose another output")


@contextlib.contextmanager
def written_whole(path: str):
    """Yield a temporary path beside `path` (same name at the end, so writers that look at the
    suffix, .gz say, see it); on success it replaces `path`, on any error it is removed. A
    writer's TraceFormatError names the file it was given: it is raised again naming `path`."""
    from .trace.events import TraceFormatError

    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".npumem-partial-{os.getpid()}-{name}")
    try:
        yield temporary
        os.replace(temporary, path)
    except TraceFormatError as exc:
        if exc.path != temporary:
            raise
        raise TraceFormatError(path, exc.position, exc.reason) from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
