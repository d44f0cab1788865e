"""A planning problem read from a file: the planner's own CSV (id,lower,upper,size), or the
lifetimes of the blocks of any trace npumem reads. The planner itself reads no traces."""

from __future__ import annotations

import os

from ..file_paths import not_a_file
from ..planning import PlanningProblem, ProblemFormatError, problem_from_trace, read_problem
from .file_checks import TraceFormatError
from .formats import detect_format, read_trace


def load_problem(path: str | os.PathLike) -> PlanningProblem:
    """A CSV problem, or the lifetimes of any trace file npumem reads (format auto-detected)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ProblemFormatError(path, "", not_a_file(path))
    with open(path, "rb") as probe:
        head = probe.read(64)
    first = head.removeprefix(b"\xef\xbb\xbf").lstrip().split(b"\n", 1)[0]
    header = b"".join(first.lower().split())                           # (any spacing)
    if header.startswith(b"id,lower,upper,size"):
        return read_problem(path)
    if set(header.split(b",")[:4]) == {b"id", b"lower", b"upper", b"size"}:
        raise ProblemFormatError(path, "line 1", f"a problem CSV's columns come in the order "
                                 f"id,lower,upper,size (then any others), not "
                                 f"{first.decode(errors='replace').strip()}")
    try:
        fmt = detect_format(path)
    except TraceFormatError as exc:
        raise ProblemFormatError(path, exc.position, "neither a problem CSV (a header "
                                 "id,lower,upper,size) nor an allocation trace: "
                                 + exc.reason) from None
    events = read_trace(path, fmt)
    return problem_from_trace(events, os.path.basename(path), notes=events.notes)
