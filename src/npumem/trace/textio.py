"""Opening trace files: gzip by content when reading, by the `.gz` suffix when writing."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import zlib
from contextlib import contextmanager
from typing import Iterator, Sequence

from ..file_paths import not_a_file
from .file_checks import TraceFormatError


def is_gzip(path: str) -> bool:
    with open(path, "rb") as probe:
        return probe.read(2) == b"\x1f\x8b"


def open_binary(path: str):
    if not os.path.isfile(path):
        raise TraceFormatError(path, "", not_a_file(path))
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def open_text(path: str):
    return io.TextIOWrapper(open_binary(path), encoding="utf-8", newline="")


def open_for_writing(path: str, binary: bool = False):
    raw = gzip.open(path, "wb", compresslevel=6) if path.endswith(".gz") else open(path, "wb")
    return raw if binary else io.TextIOWrapper(raw, encoding="utf-8", newline="")


def read_head(path: str, nbytes: int = 65536) -> bytes:
    """The first bytes of the (decompressed) file, for format detection."""
    head = b""
    try:
        with open_binary(path) as handle:
            while len(head) < nbytes and (piece := handle.read(4096)):
                head += piece
    except (OSError, EOFError, zlib.error) as exc:
        if not head:      # a damaged tail is reported by the reader, with its position
            raise TraceFormatError(path, "", f"the file is truncated or corrupt: {exc}") from None
    return head


def max_snapshot_bytes() -> int:
    """The most bytes a snapshot may take once decompressed (NPUMEM_MAX_SNAPSHOT_BYTES, default
    4 GiB): a gzip bomb must not fill memory before the reader sees it."""
    from ..units import parse_size

    text = os.environ.get("NPUMEM_MAX_SNAPSHOT_BYTES", "4GiB")
    try:
        return parse_size(text)
    except ValueError:
        raise TraceFormatError("NPUMEM_MAX_SNAPSHOT_BYTES", "", f"not a size: {text!r} "
                               "(write it as 4GiB or 4294967296)") from None


class BoundedReader:
    """A binary file that refuses to give more than `limit` bytes (decompressed), and turns a
    read's failure into a TraceFormatError: what a reader reads a window at a time."""

    def __init__(self, handle, path: str, limit: int):
        self.handle, self.path, self.limit, self.total = handle, path, limit, 0

    def readinto(self, buffer) -> int:
        try:
            count = self.handle.readinto(buffer)
        except (OSError, EOFError, zlib.error) as exc:
            after = f" after {self.total:,} bytes" if self.total else ""
            raise TraceFormatError(self.path, "", f"the file is truncated or corrupt{after}: "
                                   f"{exc}") from None
        self.total += count
        _check_size(self.path, self.total, self.limit)
        return count


@contextmanager
def bounded_reader(path: str, limit: int):
    """The (decompressed) file as a BoundedReader: read in windows, never whole in memory."""
    try:
        handle = open_binary(path)
    except OSError as exc:
        raise TraceFormatError(path, "", f"the file cannot be read: {exc}") from None
    with handle:
        if not isinstance(handle, gzip.GzipFile):       # a plain file: refused before reading
            _check_size(path, os.fstat(handle.fileno()).st_size, limit)
        yield BoundedReader(handle, path, limit)


def _check_size(path: str, size: int, limit: int) -> None:
    if size > limit:
        raise TraceFormatError(path, "", f"more than {limit} bytes once decompressed; set "
                               "NPUMEM_MAX_SNAPSHOT_BYTES to read a larger snapshot")


@contextmanager
def reading(path: str):
    """A text handle on a trace; a damaged or truncated file becomes a TraceFormatError."""
    try:
        with open_text(path) as handle:
            yield handle
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        raise TraceFormatError(path, "", f"the file is truncated or corrupt: {exc}") from None


def csv_records(path: str, required: Sequence[str], what: str) -> Iterator[tuple[str, list, dict]]:
    """(line number, row, column index by name) for each non-empty row of a CSV whose header
    has every `required` column (`what` names the file kind in the error)."""
    with reading(path) as handle:
        reader = csv.reader(handle)
        header = [cell.strip() for cell in next(reader, [])]
        missing = [name for name in required if name not in header]
        if missing:
            raise TraceFormatError(path, "1", f"not {what}: missing {missing}")
        column = {name: index for index, name in enumerate(header)}
        for row in reader:
            if row:
                yield str(reader.line_num), row, column


def json_refusal(exc: Exception) -> str:
    """Why json could not decode a value it parsed: nesting past the recursion limit, or an
    integer past Python's digit limit (both ValueError-like, but not JSONDecodeError)."""
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply to read"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg})"
    return f"a value npumem cannot read ({exc})"


def decode_json(path: str, where: str, text: str):
    """json.loads, with every refusal a TraceFormatError at `where`."""
    try:
        return json.loads(text)
    except (RecursionError, ValueError) as exc:
        raise TraceFormatError(path, where, json_refusal(exc)) from None
