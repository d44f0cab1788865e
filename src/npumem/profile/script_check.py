"""Is a profile's target a Python script? Asked before anything runs or is written, so that a
pickle, a binary, a folder or a file that does not compile gets one line and no report (as
`npumem estimate` does), not Python's traceback followed by an empty report."""

from __future__ import annotations

import os

_PICKLE = (b"\x80",)                 # a pickle's protocol opcode (protocol 2 and later)
_GZIP = b"\x1f\x8b"
_HEAD = 8192


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
    if head.startswith(_PICKLE) or head.startswith(_GZIP) or path.endswith(
            (".pickle", ".pkl", ".pickle.gz")):
        return (f"{path} is a recording (a pickle), not a script: npumem report, replay and "
                "tune read it")
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
