"""Whether a raw host pointer points at memory this process has mapped (Linux /proc/self/maps).

A raw integer from outside is trusted as the C runtime trusts it, but it must at least be
mapped: touching an unmapped address kills the process, which npumem turns into a sentence.
The map is cached and read again only when an address is not found in it (new mappings appear
as the program allocates); where /proc is not there, every pointer is taken as mapped.
"""

from __future__ import annotations

import bisect
import threading

_MAPS = "/proc/self/maps"
_lock = threading.Lock()
_starts: list[int] = []
_regions: list[tuple[int, int, bool, bool]] = []       # (start, end, readable, writable)
_available = True


def _load() -> None:
    global _available, _starts, _regions
    regions = []
    try:
        with open(_MAPS, encoding="ascii", errors="replace") as maps:
            for line in maps:
                span, perms = line.split(None, 2)[:2]
                low, high = (int(part, 16) for part in span.split("-"))
                regions.append((low, high, perms[0] == "r", perms[1] == "w"))
    except OSError:
        _available = False
        return
    regions.sort()
    _regions, _starts = regions, [region[0] for region in regions]


def _covered(address: int, nbytes: int, writable: bool) -> bool:
    """Whether [address, address + nbytes) lies in adjacent mapped regions with the access."""
    end, at = address + max(nbytes, 1), address
    i = bisect.bisect_right(_starts, at) - 1
    while i >= 0 and i < len(_regions):
        low, high, readable, can_write = _regions[i]
        if not low <= at < high or not readable or (writable and not can_write):
            return False
        if end <= high:
            return True
        at, i = high, i + 1
    return False


def is_mapped(address: int, nbytes: int, writable: bool) -> bool:
    with _lock:
        if not _available:
            return True
        if _covered(address, nbytes, writable):
            return True
        _load()                          # perhaps mapped since the last read
        return not _available or _covered(address, nbytes, writable)
