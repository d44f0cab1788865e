"""Where a leak is: the user's own line first, then the library line that allocated, and a C++
frame only when the stack has no Python frame at all.

A user acts on their own line (`logits = model(x)`, `cache[step] = out`), so that is the site
a leak is grouped and reported by; the library line under it (torch/nn/functional.py's
`linear`) says what allocated. A recording by CUDA's allocator has C++ frames around every
Python one: naming `at::meta::structured_bmm::meta` where the user's line is known helps no one.
"""

from __future__ import annotations

from dataclasses import dataclass

from .analysis import NO_STACK, _MACHINERY, is_library


@dataclass(frozen=True)
class LeakSite:
    """One stack's place, as a leak names it."""

    user: dict | None          # the innermost frame of the user's code
    library: dict | None       # the innermost Python frame, where it is a library's
    native: dict | None        # a C++ frame, only where there is no Python frame
    tag: str = ""              # user_metadata, for a stack without frames

    @property
    def key(self) -> str:
        """What leaks are grouped by."""
        for frame in (self.user, self.library, self.native):
            if frame is not None:
                return frame_text(frame)
        return f"[{self.tag}]" if self.tag else NO_STACK

    @property
    def allocated_in(self) -> str | None:
        """The library line under the user's, where both are known."""
        return frame_text(self.library) if self.user is not None and self.library else None


def frame_text(frame: dict) -> str:
    if frame.get("filename") == "<operator>":       # a node of autograd with no forward stack
        return str(frame.get("name"))
    return f"{frame.get('filename')}:{frame.get('line')} in {frame.get('name')}"


def _python(frame: dict) -> bool:
    return str(frame.get("filename", "")).endswith(".py")


def leak_site(frames: list[dict] | None, tag: str | None = None) -> LeakSite:
    frames = frames or []
    python = [frame for frame in frames if _python(frame)]
    user = next((frame for frame in python if not is_library(str(frame["filename"]))), None)
    library = python[0] if python and python[0] is not user else None
    native = None
    if not python:
        native = next((frame for frame in frames
                       if not any(mark in str(frame.get("name", "")) for mark in _MACHINERY)),
                      frames[0] if frames else None)
    return LeakSite(user, library, native, str(tag) if tag else "")
