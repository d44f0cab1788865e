"""Why a path that should name a file to read cannot be read, in one wording wherever a
file is read (traces, problems, snapshots, the CLI)."""

from __future__ import annotations

import os

NO_SUCH_FILE = "no such file"        # one wording, wherever a file to read is missing


def not_a_file(path: str) -> str:
    """Why `path`, which is no regular file, cannot be read: missing, a folder, a pipe, a
    device, a link that leads nowhere or round in a loop."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if os.path.islink(path):
            return ("is a symbolic link that loops" if exc.errno == 40 else
                    "is a symbolic link to a file that does not exist")
        return NO_SUCH_FILE
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "is a pipe (FIFO), not a file: npumem reads a trace from a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a file: npumem reads a trace from a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a file"
    return NO_SUCH_FILE if not os.path.exists(path) else "is not a regular file"
