"""A memory snapshot written as one JSON object (`json.dump(torch.cuda.memory._snapshot(), f)`),
read as a pickle is: the same schema checks (schema.py) name the first wrong field.

Without this, such a file looked like JSONL (its first line has "action" in it) and was refused
for a missing action, which told the user nothing about what the file is or what is wrong."""

from __future__ import annotations

import json
import re

from ..file_checks import TraceFormatError
from ...units import format_size
from ..textio import bounded_reader, json_refusal, max_snapshot_bytes

BOM = b"\xef\xbb\xbf"
# a snapshot's own keys, as keys ("name":), anywhere in the head: torch writes "segments" first,
# but a dict rebuilt by hand may put them in any order
_KEY = re.compile(rb'"(?:segments|device_traces)"\s*:')
_OWN_FORM = b'{"npumem_snapshot"'          # npumem's JSONL form of a snapshot (json_form.py)
JSON_LIMIT = 512 << 20                     # bytes of JSON text read whole (a pickle has no limit
                                           # but NPUMEM_MAX_SNAPSHOT_BYTES: it is read in columns)


def sniff(head: bytes) -> bool:
    """One JSON object with a snapshot's keys (not npumem's JSONL form, which names itself)."""
    text = head.removeprefix(BOM).lstrip()
    return (text.startswith(b"{") and not text.startswith(_OWN_FORM)
            and _KEY.search(text) is not None)


def load(path: str) -> dict:
    """The snapshot dict, its size bounded as a pickle's is; refusals say that the file is a
    snapshot as JSON, then what is wrong with it."""
    from .schema import check_snapshot

    chunks, total = [], 0
    with bounded_reader(path, max_snapshot_bytes()) as reader:
        buffer = bytearray(1 << 20)
        while count := reader.readinto(buffer):
            total += count
            if total > JSON_LIMIT:
                raise TraceFormatError(path, "", f"a memory snapshot written as JSON, of more than "
                                       f"{format_size(JSON_LIMIT)}: JSON is read whole into Python "
                                       "objects, about ten times its size; save it as the pickle "
                                       "torch.cuda.memory._dump_snapshot(path) writes, which "
                                       "npumem reads in columns")
            chunks.append(bytes(buffer[:count]))
    text = b"".join(chunks).removeprefix(BOM)
    try:
        data = json.loads(text)
    except (RecursionError, ValueError) as exc:
        raise TraceFormatError(path, "", f"a memory snapshot written as JSON, but "
                               f"{json_refusal(exc)}") from None
    try:
        return check_snapshot(data, path)
    except TraceFormatError as exc:
        at = f"at {exc.position}: " if exc.position and exc.position != "0" else ""
        raise TraceFormatError(path, "", f"a memory snapshot written as JSON; {at}{exc.reason}"
                               ) from None
