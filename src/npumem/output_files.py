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
    from .trace.file_checks import TraceFormatError

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


LOCK_NAME = ".npumem-lock"


class FolderInUseError(OutputPathError):
    """Another process holds the folder's lock; `pid` is that process (None if unknown)."""

    def __init__(self, folder: str, pid: int | None):
        self.folder, self.pid = folder, pid
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"output folder {folder} is being written by another run ({who}); "
                         "wait for it to finish or choose another folder")


class FolderLock:
    """Held while one run writes a folder, so that two runs given one folder cannot interleave
    their files. The lock file holds the owner's pid, for the refusal's message.

    An flock dies with its process, so a killed run never leaves the folder locked; where
    there is no fcntl (Windows), the file's existence is the lock."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = os.fspath(folder)
        self.path = os.path.join(self.folder, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> "FolderLock":
        try:
            import fcntl
        except ImportError:
            fcntl = None
        for _ in range(10):         # the file we opened may be unlinked by its last owner
            if fcntl is None:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    raise FolderInUseError(self.folder, _pid_in(self.path)) from None
            else:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    raise FolderInUseError(self.folder, _pid_in(self.path, wait=True)) from None
                try:
                    current = os.stat(self.path)
                except FileNotFoundError:
                    current = None
                held = os.fstat(fd)
                if current is None or (current.st_ino, current.st_dev) != (held.st_ino, held.st_dev):
                    os.close(fd)
                    continue
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            except OSError:
                self._fd = fd
                self.release()
                raise
            self._fd = fd
            return self
        raise FolderInUseError(self.folder, None)

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)          # before closing: nobody locks the old file after us
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _pid_in(path: str, wait: bool = False) -> int | None:
    """The pid a lock file names; its owner writes it just after locking, so wait a little."""
    import time

    for _ in range(20 if wait else 1):
        try:
            with open(path, encoding="ascii") as handle:
                text = handle.read().strip()
            if text.isdigit():
                return int(text)
        except (OSError, ValueError):
            pass
        if wait:
            time.sleep(0.01)
    return None
