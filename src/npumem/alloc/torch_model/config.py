"""PyTorch's allocator settings: PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF, as the model
of PyTorch's caching allocator uses them.

The text is read the way c10's AllocatorConfig lexes it (`key:value` pairs separated by commas,
`[ ... ]` lists for `roundup_power2_divisions`), with its checks and its defaults, so a setting
means here what it means in PyTorch. A snapshot records the settings it ran with
(`allocator_settings`); `from_snapshot` reads them back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...errors import InvalidParamError

MiB = 1 << 20
NO_LIMIT = (1 << 64) - 1            # SIZE_MAX: max_split_size when unset
LARGE_BUFFER = 20 * MiB             # kLargeBuffer
INTERVALS = 16                      # roundup_power2_divisions: 1 MiB .. 32 GiB, one per power of 2

# Keys each flavour accepts. The pinned-memory keys act on host memory only: accepted, no effect.
_COMMON = ("max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
           "roundup_power2_divisions", "expandable_segments", "pinned_num_register_threads",
           "pinned_use_background_threads", "backend")
KEYS = {
    "cuda": _COMMON + ("release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                       "pinned_reserve_segment_size_mb", "graph_capture_record_stream_reuse"),
    "npu": _COMMON + ("large_segment_size_mb", "segment_size_mb", "base_addr_aligned_kb",
                      "page_size", "per_process_memory_fraction", "release_lock_on_npumalloc",
                      "multi_stream_lazy_reclaim", "throw_on_npumalloc_oom",
                      "pin_memory_expandable_segments", "pinned_mem_register",
                      "pinned_reserve_segment_size_mb", "pinned_max_round_threshold_mb",
                      "pinned_max_cached_size_mb"),
}
ENV_NAME = {"cuda": "PYTORCH_CUDA_ALLOC_CONF", "npu": "PYTORCH_NPU_ALLOC_CONF"}


@dataclass(frozen=True)
class TorchAllocatorConfig:
    """What PyTorch's DeviceCachingAllocator (or torch_npu's) reads from its settings."""

    flavour: str = "cuda"                        # "cuda" or "npu" (torch_npu)
    max_split_size: int = NO_LIMIT
    max_non_split_rounding_size: int = LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple = (0,) * INTERVALS
    expandable_segments: bool = False
    release_lock_on_malloc: bool = False         # lock handling only: placement is unchanged
    per_process_memory_fraction: float | None = None   # set_per_process_memory_fraction()
    large_segment_size: int = LARGE_BUFFER       # npu: large_segment_size_mb / segment_size_mb
    base_addr_aligned_kb: int = 16               # npu: start alignment in expandable segments
    page_size_1g: bool = False                   # npu: page_size:1g
    pad: int | None = None                       # npu: bytes added before rounding (CANN's +32)
    text: str = ""                               # the settings string, as given

    def __post_init__(self) -> None:
        if self.flavour not in KEYS:
            raise InvalidParamError(f"allocator flavour {self.flavour!r}: use 'cuda' or 'npu'")
        if self.pad is None:
            object.__setattr__(self, "pad", 32 if self.flavour == "npu" else 0)

    @property
    def env_name(self) -> str:
        return ENV_NAME[self.flavour]

    def divisions(self, size: int) -> int:
        """roundup_power2_divisions for a request of `size` bytes (its power-of-2 interval)."""
        index = size.bit_length() - 1 - 20
        return self.roundup_power2_divisions[min(max(index, 0), INTERVALS - 1)]

    def replace(self, **changes) -> "TorchAllocatorConfig":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """The settings as PyTorch's `key:value,...` text ("" for the defaults)."""
        default = TorchAllocatorConfig(self.flavour)
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size != default.max_split_size:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding_size != default.max_non_split_rounding_size:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MiB}")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        if self.roundup_power2_divisions != default.roundup_power2_divisions:
            parts.append("roundup_power2_divisions:" + _describe_divisions(self.roundup_power2_divisions))
        if self.flavour == "npu":
            if self.large_segment_size != default.large_segment_size:
                parts.append(f"large_segment_size_mb:{self.large_segment_size // MiB}")
            if self.base_addr_aligned_kb != default.base_addr_aligned_kb:
                parts.append(f"base_addr_aligned_kb:{self.base_addr_aligned_kb}")
            if self.page_size_1g:
                parts.append("page_size:1g")
            if self.per_process_memory_fraction is not None:
                parts.append(f"per_process_memory_fraction:{self.per_process_memory_fraction:g}")
        if self.release_lock_on_malloc:
            parts.append(("release_lock_on_cudamalloc" if self.flavour == "cuda"
                          else "release_lock_on_npumalloc") + ":True")
        return ",".join(parts)


def _describe_divisions(divisions: tuple) -> str:
    """The shortest text c10's parser reads back as `divisions`: the first interval named
    also fills the ones below it, and `>` fills from the last one named upwards."""
    if len(set(divisions)) == 1:
        return str(divisions[0])
    first_end = 0
    while divisions[first_end + 1] == divisions[0]:
        first_end += 1
    last_start = len(divisions) - 1
    while divisions[last_start - 1] == divisions[-1]:
        last_start -= 1
    items = [f"{1 << first_end}:{divisions[0]}"]
    items += [f"{1 << index}:{divisions[index]}" for index in range(first_end + 1, last_start)]
    if last_start > first_end:
        items += [f"{1 << last_start}:{divisions[-1]}", f">:{divisions[-1]}"]
    return "[" + ",".join(items) + "]"


def _lex(text: str) -> list[str]:
    """AllocatorConfig::lexArgs: split on , : [ ] (kept as tokens), drop spaces."""
    tokens, word = [], ""
    for char in text:
        if char in ",:[]":
            if word:
                tokens.append(word)
                word = ""
            tokens.append(char)
        elif char != " ":
            word += char
    if word:
        tokens.append(word)
    return tokens


class _Tokens:
    def __init__(self, text: str, env: str):
        self.items, self.i, self.env = _lex(text), 0, env

    def fail(self, message: str) -> InvalidParamError:
        return InvalidParamError(f"{self.env}: {message}")

    def take(self, expected: str | None = None) -> str:
        if self.i >= len(self.items):
            raise self.fail(f"expected {expected!r} at the end" if expected else
                            "a key has no value")
        token = self.items[self.i]
        self.i += 1
        if expected is not None and token != expected:
            raise self.fail(f"expected {expected!r}, got {token!r}")
        return token

    def more(self) -> bool:
        return self.i < len(self.items)


def _int(tokens: _Tokens, key: str) -> int:
    text = tokens.take()
    if not text.isdigit():
        raise tokens.fail(f"{key} must be a whole number, got {text!r}")
    return int(text)


def _megabytes(tokens: _Tokens, key: str, low: int, high: int | None = None) -> int:
    """A size in MiB within [low, high], as bytes."""
    value = _int(tokens, key)
    if value < low or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise tokens.fail(f"{key} must be {bounds}, got {value}")
    return value * MiB


def _fraction(tokens: _Tokens, key: str, one_allowed: bool) -> float:
    """A number in (0, 1), or (0, 1] with `one_allowed`."""
    text = tokens.take()
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 < value < 1 or (one_allowed and value == 1)):
        raise tokens.fail(f"{key} must be in (0, 1{']' if one_allowed else ')'}, got {text!r}")
    return value


def _bool(tokens: _Tokens, key: str) -> bool:
    text = tokens.take()
    if text not in ("True", "False"):
        raise tokens.fail(f"{key} takes True or False (capitalised, as PyTorch), got {text!r}")
    return text == "True"


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _divisions(tokens: _Tokens) -> tuple:
    """The single-number form, or `[256:1,512:2,>:8]` with interval starts in MiB."""
    first = tokens.take()
    if first != "[":
        if not first.isdigit() or not _power_of_two(int(first)):
            raise tokens.fail(f"roundup_power2_divisions must be a power of 2, got {first!r}")
        return (int(first),) * INTERVALS
    values = [0] * INTERVALS
    last_index, first_value = 0, True
    while True:
        start = tokens.take()
        if start == "]":
            break
        tokens.take(":")
        value = _int(tokens, "roundup_power2_divisions")
        if value and not _power_of_two(value):
            raise tokens.fail(f"roundup_power2_divisions: divisions must be 0 or a power of 2, got {value}")
        if start == ">":
            values[last_index:] = [value] * (INTERVALS - last_index)   # as c10 does, from the last interval named
        else:
            if not start.isdigit() or not _power_of_two(int(start)):
                raise tokens.fail(f"roundup_power2_divisions: interval starts are powers of 2 "
                                  f"(MiB), got {start!r}")
            index = min(int(start).bit_length() - 1, INTERVALS - 1)
            if first_value:
                values[:index] = [value] * index
                first_value = False
            values[index] = value
            last_index = index
        following = tokens.take()
        if following == "]":
            break
        if following != ",":
            raise tokens.fail(f"roundup_power2_divisions: expected ',' or ']', got {following!r}")
    return tuple(values)


def parse_config(text: str | None, flavour: str = "cuda",
                 base: TorchAllocatorConfig | None = None) -> TorchAllocatorConfig:
    """Settings from PyTorch's `key:value,...` text, on top of `base` (default: PyTorch's
    defaults). Raises InvalidParamError naming the keys that exist for an unknown one."""
    config = base or TorchAllocatorConfig(flavour)
    flavour = config.flavour
    env = ENV_NAME[flavour]
    tokens = _Tokens(text or "", env)
    changes: dict = {}
    while tokens.more():
        key = tokens.take()
        if key not in KEYS[flavour]:
            other = "npu" if flavour == "cuda" else "cuda"
            where = f" (it is a {ENV_NAME[other]} key)" if key in KEYS[other] else ""
            raise tokens.fail(f"unknown key {key!r}{where}; the keys are "
                              f"{', '.join(sorted(KEYS[flavour]))}")
        tokens.take(":")
        if key == "max_split_size_mb":
            changes["max_split_size"] = _megabytes(tokens, key, LARGE_BUFFER // MiB)
        elif key == "max_non_split_rounding_mb":
            changes["max_non_split_rounding_size"] = _megabytes(tokens, key, LARGE_BUFFER // MiB)
        elif key == "garbage_collection_threshold":
            changes["garbage_collection_threshold"] = _fraction(tokens, key, one_allowed=False)
        elif key == "roundup_power2_divisions":
            changes["roundup_power2_divisions"] = _divisions(tokens)
        elif key == "expandable_segments":
            changes["expandable_segments"] = _bool(tokens, key)
        elif key in ("release_lock_on_cudamalloc", "release_lock_on_npumalloc"):
            changes["release_lock_on_malloc"] = _bool(tokens, key)
        elif key == "backend":
            value = tokens.take()
            if value != "native":
                raise tokens.fail(f"backend:{value} hands memory to the driver's own pool, which "
                                  "npumem does not model; only backend:native is replayed")
        elif key in ("large_segment_size_mb", "segment_size_mb"):
            changes["large_segment_size"] = _megabytes(tokens, key, 20, 512)
        elif key == "base_addr_aligned_kb":
            value = _int(tokens, key)
            if value > 16:
                raise tokens.fail(f"base_addr_aligned_kb must be in [0, 16], got {value}")
            changes["base_addr_aligned_kb"] = value
        elif key == "page_size":
            value = tokens.take()
            if value != "1g":
                raise tokens.fail(f"page_size takes 1g, got {value!r}")
            changes["page_size_1g"] = True
        elif key == "per_process_memory_fraction":
            changes["per_process_memory_fraction"] = _fraction(tokens, key, one_allowed=True)
        else:                                   # host-memory and locking keys: no placement effect
            tokens.take()
        if tokens.more():
            tokens.take(",")
    joined = ",".join(filter(None, [config.text, (text or "").strip()]))
    return config.replace(text=joined, **changes)


def from_snapshot(settings: dict | None, flavour: str = "cuda") -> TorchAllocatorConfig:
    """The settings a snapshot recorded (`allocator_settings`); defaults where it has none."""
    config = TorchAllocatorConfig(flavour)
    if not isinstance(settings, dict):
        return config
    changes: dict = {}
    split = settings.get("max_split_size")
    if isinstance(split, int) and split > 0:
        changes["max_split_size"] = split
    threshold = settings.get("garbage_collection_threshold")
    if isinstance(threshold, (int, float)) and 0 < threshold < 1:
        changes["garbage_collection_threshold"] = float(threshold)
    if isinstance(settings.get("expandable_segments"), bool):
        changes["expandable_segments"] = settings["expandable_segments"]
    divisions = settings.get("roundup_power2_divisions")
    if isinstance(divisions, dict) and divisions:
        ordered = [int(divisions[key]) for key in sorted(divisions, key=lambda k: int(k))]
        changes["roundup_power2_divisions"] = tuple((ordered + [0] * INTERVALS)[:INTERVALS])
    elif isinstance(divisions, int):
        changes["roundup_power2_divisions"] = (divisions,) * INTERVALS
    if isinstance(settings.get("release_lock_on_cudamalloc"), bool):
        changes["release_lock_on_malloc"] = settings["release_lock_on_cudamalloc"]
    text = settings.get(ENV_NAME[flavour]) or settings.get("PYTORCH_ALLOC_CONF") or ""
    return config.replace(text=text if isinstance(text, str) else "", **changes)
