"""Allocator settings: NPUMEM_ALLOC_CONF ("key:value,key:value") and set_allocator_settings.

The keys and their meaning follow PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF
(REFERENCE.md section 4), so a setting people already use means the same thing here.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..errors import InvalidParamError

MiB = 1 << 20


@dataclass(frozen=True)
class AllocatorSettings:
    """How the caching pool behaves. Defaults keep reserved memory close to what is live."""

    expandable_segments: bool = True
    """Map pages of one growing address range per stream (True), or cache whole segments as
    PyTorch does by default (False)."""
    max_split_size_mb: float | None = None
    """Segment mode: cached blocks at least this large are not split for smaller requests."""
    garbage_collection_threshold: float | None = None
    """Segment mode: when reserved memory passes this fraction of the limit, free cached blocks
    that were not reused before asking the device for more."""
    roundup_power2_divisions: int = 0
    """Round requests above 256 bytes up to one of this many steps between powers of two
    (0 disables); fewer distinct sizes reuse better."""
    base_addr_aligned_kb: int = 16
    """Start alignment of device segments in KiB (torch_npu's key, 0..16)."""
    segment_size_mb: float = 20
    """Segment mode: size of the segments that serve mid-sized requests (1 MiB .. 10 MiB)."""
    block_alignment: int = 64
    """Start alignment of every block: 64 (the carving rule) or 128 (media / DVPP memory)."""
    per_process_memory_fraction: float = 1.0
    """Share of the device's memory this pool may reserve."""
    predictive: bool = False
    """Learn the step the program repeats and serve it from a planned arena
    (docs/predictive.md)."""

    def __post_init__(self) -> None:
        checks = [
            (self.max_split_size_mb is None or self.max_split_size_mb > 20,
             "max_split_size_mb must be greater than 20"),
            (self.garbage_collection_threshold is None or 0 < self.garbage_collection_threshold < 1,
             "garbage_collection_threshold must be between 0 and 1"),
            (0 <= self.roundup_power2_divisions <= 64 and
             (self.roundup_power2_divisions & (self.roundup_power2_divisions - 1)) == 0,
             "roundup_power2_divisions must be 0 or a power of two up to 64"),
            (0 <= self.base_addr_aligned_kb <= 16, "base_addr_aligned_kb must be 0..16"),
            (self.segment_size_mb > 0, "segment_size_mb must be positive"),
            (self.block_alignment in (64, 128), "block_alignment must be 64 or 128"),
            (0 < self.per_process_memory_fraction <= 1, "per_process_memory_fraction must be in (0, 1]"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidParamError(f"allocator settings: {message}")

    def replace(self, **changes) -> "AllocatorSettings":
        return dataclasses.replace(self, **changes)


_FIELDS = {f.name: f for f in dataclasses.fields(AllocatorSettings)}
KEYS = tuple(_FIELDS)
_SEGMENT_MODE_ONLY = ("max_split_size_mb", "garbage_collection_threshold", "segment_size_mb")


def describe_changes(settings: AllocatorSettings) -> str:
    """"key:value,..." for the settings that differ from the defaults ("defaults" if none)."""
    default = AllocatorSettings()
    changed = [f"{name}:{_text(getattr(settings, name))}" for name in _FIELDS
               if getattr(settings, name) != getattr(default, name)]
    return ",".join(changed) or "defaults"


def _text(value) -> str:
    """A setting's value as a person writes it: 64, not 64.0."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def _convert(key: str, text: str):
    kind = _FIELDS[key].type
    text = text.strip()
    if key == "roundup_power2_divisions" and text.startswith("["):
        raise InvalidParamError(f"allocator settings: roundup_power2_divisions={text} gives each "
                                "size range its own count, which is PyTorch's form; the pool "
                                "takes one count for every size (0 or a power of two up to 64)")
    try:
        if "bool" in kind:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        if key == "max_split_size_mb" or key == "garbage_collection_threshold":
            return None if text.lower() in ("none", "") else float(text)
        if "int" in kind:
            return int(text)
        return float(text)
    except ValueError:
        hint = " (True or False)" if "bool" in kind else ""
        raise InvalidParamError(f"allocator settings: {key}={text!r} is not a valid {kind}{hint}") from None


def split_items(text: str) -> list[str]:
    """The comma-separated items of `text`, split only on the commas outside `[ ]`, so that
    PyTorch's list values (`[256:1,>:4]`) stay whole; blank items dropped."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text + ","):
        depth += (char == "[") - (char == "]")
        if char == "," and depth <= 0:
            items.append(text[start:index].strip())
            start = index + 1
    return [item for item in items if item]


def split_pairs(text: str) -> list[tuple[str, str]]:
    """The (key, value) items of "key:value,key=value,..." (`split_items`)."""
    pairs = []
    for item in split_items(text):
        cut = min((i for i in (item.find(":"), item.find("=")) if i >= 0), default=-1)
        if cut < 0:
            raise InvalidParamError(f"allocator settings: {item!r} has no value; write "
                                    f"{item.strip()}=VALUE (or {item.strip()}:VALUE)")
        pairs.append((item[:cut].strip(), item[cut + 1:].strip()))
    return pairs


def parse_settings(text: str | None, base: AllocatorSettings | None = None) -> AllocatorSettings:
    """Settings from "key:value,key:value" (also "key=value"), on top of `base`."""
    base = base or AllocatorSettings()
    if not text or not text.strip():
        return base
    changes = {}
    for key, value in split_pairs(text):
        if key not in _FIELDS:
            raise InvalidParamError(f"allocator settings: unknown key {key!r}; known keys: "
                                    f"{', '.join(sorted(_FIELDS))}")
        changes[key] = _convert(key, value)
    return base.replace(**changes)


def settings_warnings(settings: AllocatorSettings) -> list[str]:
    """Settings that have no effect in the mode the pool is in."""
    if not settings.expandable_segments:
        return []
    default = AllocatorSettings()
    idle = [key for key in _SEGMENT_MODE_ONLY if getattr(settings, key) != getattr(default, key)]
    if not idle:
        return []
    one = len(idle) == 1
    return [f"{' and '.join(idle)} {'has' if one else 'have'} no effect with "
            f"expandable_segments:True (the pool's default): {'it acts' if one else 'they act'} "
            "on cached segments; add expandable_segments:False"]


def settings_from_env() -> AllocatorSettings:
    return parse_settings(os.environ.get("NPUMEM_ALLOC_CONF", ""))
