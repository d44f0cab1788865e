"""PyTorch's own caching allocator, read the way npumem reads its pool: `memory_stats()` with the
pool hit rate and fragmentation added, and the summary table, from a live process (cuda or npu)
or from what a user's run saved (`json.dump(torch.cuda.memory_stats(), f)`, and the snapshot
pickle of `torch.cuda.memory._dump_snapshot`, which `npumem report` also reads).

    npumem.memory.torch_memory_summary("cuda:0")                 # in the training process
    npumem.memory.torch_memory_summary("stats.json", snapshot="snap.pickle")   # afterwards
"""

from __future__ import annotations

import json
import os

from ..alloc.summary import format_summary
from ..errors import FeatureNotSupportedError, InvalidParamError
from .fragmentation import analyze
from ..trace.snapshot import load_snapshot

# Keys every torch memory_stats() has once the allocator is in use; a file without them is not one.
_REQUIRED = ("allocated_bytes.all.current", "reserved_bytes.all.current")


def _live_device(source: str | None):
    """(device module, torch.device) for a device string, or the current accelerator."""
    from ..device.torch_backend import import_torch

    torch = import_torch()
    if source is None:
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is None:
            raise FeatureNotSupportedError(
                "PyTorch sees no accelerator here, so it has no caching allocator to read; pass "
                "a file saved with json.dump(torch.cuda.memory_stats(), f)")
        source = accelerator.type
    device = torch.device(source)
    module = torch.get_device_module(device.type)
    if device.type == "cpu" or not module.is_available():
        raise FeatureNotSupportedError(f"{device}: PyTorch has no caching allocator there to read")
    return module, device


def torch_memory_stats(source=None, snapshot=None) -> dict:
    """PyTorch's memory_stats() with `cache_hit_rate` and, given a snapshot, `fragmentation`.

    `source`: None (the current accelerator), a device ("cuda:1"), a JSON file of a saved
    memory_stats() dict, or the dict itself. `snapshot`: a snapshot dict or pickle path."""
    if isinstance(source, dict):
        stats = dict(source)
        where = "the stats dict"
    elif isinstance(source, (str, os.PathLike)) and os.path.isfile(source):
        stats, where = _read_stats_file(source), str(source)
    else:
        module, device = _live_device(source)
        stats, where = dict(module.memory_stats(device)), str(device)
    missing = [key for key in _REQUIRED if key not in stats]
    if missing:
        raise InvalidParamError(f"{where}: not PyTorch memory_stats() (no {', '.join(missing)}); "
                                "is the allocator used yet, or is this another file?")
    allocations = stats.get("allocation.all.allocated", 0)
    segments = stats.get("segment.all.allocated", 0)       # each one a device malloc: a miss
    stats["cache_hit_rate"] = max(0.0, 1 - segments / allocations) if allocations else 1.0
    if snapshot is not None:
        data = snapshot if isinstance(snapshot, dict) else load_snapshot(snapshot)
        pools = analyze(data)
        free = sum(p.free for p in pools)
        largest = max((p.largest_free for p in pools), default=0)
        stats["fragmentation"] = (free - largest) / free if free else 0.0
    return stats


def _read_stats_file(path) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        data = json.loads(text) if text.strip() else None
    except (OSError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise InvalidParamError(f"{path}: cannot read it as JSON: {reason}") from None
    if data is None and not text.strip():      # as every other reader says it
        raise InvalidParamError(f"{path}:1: the file is empty")
    if not isinstance(data, dict):
        raise InvalidParamError(f"{path}: holds a JSON {type(data).__name__}, not the dict "
                                "torch.cuda.memory_stats() returns")
    for key, value in data.items():
        if key == "max_split_size" and value == -1:       # PyTorch's word for "not set"
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value < 2**64:
            shown = repr(value) if isinstance(value, (int, float)) else type(value).__name__
            raise InvalidParamError(f"{path}: {key!r} is {shown[:40]}; memory_stats() values "
                                    "are counts and byte totals in [0, 2**64)")
    return data


def torch_memory_summary(source=None, snapshot=None, device: int = 0,
                         abbreviated: bool = False) -> str:
    """npumem's memory_summary() table (PyTorch's layout plus hit rate and fragmentation) for
    PyTorch's allocator; arguments as in `torch_memory_stats`."""
    stats = torch_memory_stats(source, snapshot)
    word = "NPU" if isinstance(source, str) and source.startswith("npu") else "GPU"
    return format_summary(stats, device, abbreviated, title="PyTorch caching allocator",
                          device_word=word)
