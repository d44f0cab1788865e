"""Is a profile's target a Python script? Asked before anything runs or is written, so that a
pickle, a binary, a folder or a file that does not compile gets one line and no report (as
`npumem estimate` does), not Python's traceback followed by an empty report."""

from __future__ import annotations

import json
import os

_PICKLE = (b"\x80",)                 # a pickle's protocol opcode (protocol 2 and later)
_GZIP = b"\x1f\x8b"
_HEAD = 8192
# what npumem reads as a recording (a JSON snapshot or JSONL trace is a dict literal to Python,
# and compiles: it ran as a script and left an empty report)
_RECORDING_ENDINGS = (".json", ".jsonl", ".csv", ".csv.gz", ".json.gz", ".jsonl.gz")
_READ_BY = "npumem report, replay, tune and view read it"


def not_a_script(path: str) -> str | None:
    """Why `path` cannot be run as a script (a sentence that names it), or None."""
    if os.path.isdir(path):
        return (f"{path} is a folder, not a script (give the Python file to run, or -m "
                "package.module; npumem report reads a profile folder)")
    if not os.path.isfile(path):
        return f"no such script: {path}"
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except OSError as exc:
        return f"{path}: cannot read it: {exc.strerror}"
    head = source[:_HEAD]
    lowered = path.lower()
    if head.startswith(_PICKLE) or lowered.endswith((".pickle", ".pkl", ".pickle.gz")):
        return f"{path} is a recording (a pickle), not a script: {_READ_BY}"
    if lowered.endswith(_RECORDING_ENDINGS):
        kind = "a CSV file" if ".csv" in lowered else "JSON"
        return f"{path} is a recording ({kind}), not a script: {_READ_BY}"
    if head.startswith(_GZIP):
        return (f"{path} is gzip-compressed, not a Python script (if it is a recording, "
                "npumem report, replay, tune and view read it)")
    if not lowered.endswith((".py", ".pyw")) and _json_first_line(head):
        return f"{path} is a recording (JSON), not a script: {_READ_BY}"
    if b"\0" in head:
        return f"{path} is a binary file, not a Python script"
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        return f"{path} does not compile: {exc.msg}{where}"
    except ValueError as exc:                    # null bytes past the head, and such
        return f"{path} is not a Python script: {exc}"
    return None


def _json_first_line(head: bytes) -> bool:
    """The file's first line is a JSON object or list (a JSON snapshot or a JSONL trace)."""
    first = head.lstrip().split(b"\n", 1)[0].strip()
    if not first.startswith((b"{", b"[")):
        return False
    try:
        return isinstance(json.loads(first), (dict, list))
    except ValueError:       # a JSON value over several lines: the whole head, if it is whole
        try:
            return isinstance(json.loads(head), (dict, list))
        except ValueError:
            return False
