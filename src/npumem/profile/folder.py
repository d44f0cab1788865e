"""A profile folder: where `npumem profile` writes its files, one run at a time, and which of
them a command that takes the folder reads."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InvalidParamError
from ..output_files import LOCK_NAME, FolderLock, OutputPathError

OUTPUTS = ("report.html", "snapshot.pickle", "trace.json", "memory_record.csv",
           "operator_memory.csv", "leaks.txt", "summary.txt")
SNAPSHOTS = ("torch_snapshot.pickle", "snapshot.pickle")      # what a profile folder is read by


def profile_snapshot(path: str | os.PathLike) -> str:
    """The file to read for `path`: itself, or for a profile folder its torch_snapshot.pickle
    (PyTorch's memory, what a torch script's report is about), else its snapshot.pickle.
    InvalidParamError says what a folder lacks."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return path
    for name in SNAPSHOTS:
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    raise InvalidParamError(f"{path} is a folder without torch_snapshot.pickle or snapshot.pickle "
                            "(the snapshots an npumem profile folder holds); give a profile "
                            "folder or a snapshot file")


def claim_folder(out: str | os.PathLike, force: bool = False) -> tuple[Path, FolderLock]:
    """prepare_folder, holding the folder's lock: a second run given the same folder is
    refused while this one runs. Release the lock when the files are written."""
    path = prepare_folder(out, force=True)
    try:
        lock = FolderLock(path).acquire()
    except OutputPathError as exc:
        raise InvalidParamError(str(exc)) from None
    except OSError as exc:
        raise InvalidParamError(f"cannot write to output folder {path}: {exc.strerror}") from None
    try:
        prepare_folder(path, force)
    except BaseException:
        lock.release()
        raise
    return path, lock


def prepare_folder(out: str | os.PathLike, force: bool = False) -> Path:
    """Create the output folder; refuse one that already holds files unless `force` (the lock of
    a run writing it does not count: claim_folder refuses that one, naming the run)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise InvalidParamError(f"output folder {path} exists and is a file")
    if path.is_dir() and any(p.name != LOCK_NAME for p in path.iterdir()) and not force:
        raise InvalidParamError(f"output folder {path} exists and is not empty; choose another "
                                "--out or pass --force to overwrite its files")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".npumem-write-test-{os.getpid()}"      # runs side by side: one each
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise InvalidParamError(f"cannot write to output folder {path}: {exc.strerror}") from None
    return path
