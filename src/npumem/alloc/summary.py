"""memory_summary(): PyTorch's 75-column table, plus the pool's hit rate and fragmentation."""

from __future__ import annotations

WIDTH = 77   # 75 columns inside the frame, as PyTorch prints it


def _bytes(value: int) -> str:
    unit, scale = "B", 1
    for name, shift in (("KiB", 10), ("MiB", 20), ("GiB", 30)):
        if abs(value) >= 10 << shift:           # switch units once there are two digits
            unit, scale = name, 1 << shift
    return f"{round(value / scale)} {unit}"


def _cell(value, is_bytes: bool) -> str:
    return f" {_bytes(value) if is_bytes else value:>10} "


def _line(char: str = "-") -> str:
    return "|" + char * (WIDTH - 2) + "|"


def _centered(text: str) -> str:
    return "|" + text.center(WIDTH - 2) + "|"


ROWS = [
    ("allocated_bytes", "Allocated memory", True),
    ("active_bytes", "Active memory", True),
    ("requested_bytes", "Requested memory", True),
    ("reserved_bytes", "{device} reserved memory", True),
    ("inactive_split_bytes", "Non-releasable memory", True),
    ("allocation", "Allocations", False),
    ("active", "Active allocs", False),
    ("segment", "{device} reserved segments", False),
    ("inactive_split", "Non-releasable allocs", False),
]


def format_summary(stats: dict, device: int, abbreviated: bool = False,
                   title: str = "npumem NPU", device_word: str = "NPU") -> str:
    """The table for one device's `memory_stats()` (fragmentation shows n/a when unknown);
    `device_word` names the device in the row labels ("NPU", "GPU")."""
    lines = [_line("="), _centered(f"{title} memory summary, device ID {device}"), _line()]
    left = f"{device_word} OOMs: {stats.get('num_ooms', 0)}"
    right = f"device alloc retries: {stats.get('num_alloc_retries', 0)}"
    half = (WIDTH - 3) // 2
    lines.append("|" + left.center(half) + "|" + right.center(WIDTH - 3 - half) + "|")
    lines += [_line("="), "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
              _line()]
    for index, (key, title, is_bytes) in enumerate(ROWS):
        pools = [("all", title)] if abbreviated else \
            [("all", title), ("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        for pool, label in pools:
            values = [stats.get(f"{key}.{pool}.{metric}", 0)
                      for metric in ("current", "peak", "allocated", "freed")]
            label = label.format(device=device_word)
            lines.append(f"| {label:<21} |" + "|".join(_cell(v, is_bytes) for v in values) + "|")
        if index in (4, 8):
            lines.append(_line())
    hit = f"Pool hit rate: {stats.get('cache_hit_rate', 1.0) * 100:.1f}%"
    frag = f"Fragmentation: {stats['fragmentation'] * 100:.1f}%" if "fragmentation" in stats \
        else "Fragmentation: n/a (needs a snapshot)"
    lines.append("|" + hit.center(half) + "|" + frag.center(WIDTH - 3 - half) + "|")
    if "prediction.hit_rate" in stats:
        predicted = (f"Predictive: {stats['prediction.hit_rate'] * 100:.1f}% of "
                     f"{stats['prediction.hits'] + stats['prediction.misses']} requests hit the plan, "
                     f"arena {_bytes(stats['prediction.arena_bytes'])}")
        lines.append(_line())
        lines.append(_centered(predicted))
    lines.append(_line("="))
    return "\n".join(lines) + "\n"
