"""PyTorch's allocator settings: PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF, as the model
of PyTorch's caching allocator uses them.

The text is read the way c10's AllocatorConfig lexes it (`key:value` pairs separated by commas,
`[ ... ]` lists for `roundup_power2_divisions`), with its checks and its defaults, so a setting
means here what it means in PyTorch: what PyTorch or torch_npu stop on at startup (an unknown
key, a bad value, torch_npu's refused pairs) raises, and `config_warnings` lists what they only
warn about or document to do nothing. `read_env` reads the environment in PyTorch's order of
variables. A snapshot records the settings it ran with (`allocator_settings`); `from_snapshot`
reads them back.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field

from ...errors import InvalidParamError

MiB = 1 << 20
NO_LIMIT = (1 << 64) - 1            # SIZE_MAX: max_split_size when unset
LARGE_BUFFER = 20 * MiB             # kLargeBuffer
INTERVALS = 16                      # roundup_power2_divisions: 1 MiB .. 32 GiB, one per power of 2

# Keys each flavour accepts: c10's AcceleratorAllocatorConfig and CUDAAllocatorConfig as of
# PyTorch 2.13, torch_npu's NPUAllocatorConfig (kNPUSupportAccKeys, NPUAllocatorConfig.cpp l.33,
# and getKeys in NPUAllocatorConfig.h). Both stop at startup on any other key. The
# pinned-memory, locking and OOM-reporting keys act on host memory or threads: checked, no effect
# on placement.
_COMMON = ("max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
           "roundup_power2_divisions", "expandable_segments", "large_segment_size_mb",
           "pinned_use_background_threads", "per_process_memory_fraction",
           "pinned_reserve_segment_size_mb")
KEYS = {
    "cuda": _COMMON + ("backend", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
                       "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
                       "pinned_num_register_threads", "pinned_max_round_threshold_mb",
                       "pinned_max_cached_size_mb", "pinned_free_catch_all",
                       "graph_capture_record_stream_reuse", "throw_on_cudamalloc_oom"),
    "npu": _COMMON + ("segment_size_mb", "base_addr_aligned_kb", "page_size",
                      "release_lock_on_npumalloc", "multi_stream_lazy_reclaim",
                      "throw_on_npumalloc_oom", "pin_memory_expandable_segments",
                      "pinned_mem_register", "pinned_max_round_threshold_mb",
                      "pinned_max_cached_size_mb"),
}
_BOOLS = {"expandable_segments", "pinned_use_background_threads", "release_lock_on_cudamalloc",
          "release_lock_on_hipmalloc", "release_lock_on_npumalloc", "pinned_use_cuda_host_register",
          "pinned_use_hip_host_register", "pinned_free_catch_all", "throw_on_cudamalloc_oom",
          "graph_capture_record_stream_reuse", "multi_stream_lazy_reclaim", "throw_on_npumalloc_oom",
          "pin_memory_expandable_segments", "pinned_mem_register"}
ENV_NAME = {"cuda": "PYTORCH_CUDA_ALLOC_CONF", "npu": "PYTORCH_NPU_ALLOC_CONF"}
GENERIC_ENV = "PYTORCH_ALLOC_CONF"          # PyTorch 2.9+: any device


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
    large_segment_size: int = LARGE_BUFFER       # large_segment_size_mb
    segment_size: int = 0                        # npu: segment_size_mb (0: unset)
    base_addr_aligned_kb: int = 16               # npu: start alignment in expandable segments
    page_size_1g: bool = False                   # npu: page_size:1g
    multi_stream_lazy_reclaim: bool = False      # npu: when cross-stream frees are reaped
    pad: int | None = None                       # npu: bytes added before rounding (npu_pad)
    text: str = ""                               # the settings string, as given
    notes: tuple = field(default=(), compare=False)   # how the text was read (config_warnings)

    def __post_init__(self) -> None:
        if self.flavour not in KEYS:
            raise InvalidParamError(f"allocator flavour {self.flavour!r}: use 'cuda' or 'npu'")
        if self.pad is None:
            object.__setattr__(self, "pad", 32 if self.flavour == "npu" else 0)

    @property
    def env_name(self) -> str:
        return ENV_NAME[self.flavour]

    @property
    def expandable_large_page(self) -> int:
        """The page a large pool's expandable segment maps in (page_size:1g aside).
        torch_npu get_custom_expandable_segment_size: large_segment_size_mb when it is not the
        default 20 MiB, else the deprecated segment_size_mb when set, else 20 MiB."""
        if self.large_segment_size != LARGE_BUFFER:
            return self.large_segment_size
        return self.segment_size or LARGE_BUFFER

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
        if self.max_non_split_rounding_size != self.large_segment_size:     # c10's default
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MiB}")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        if self.roundup_power2_divisions != default.roundup_power2_divisions:
            parts.append("roundup_power2_divisions:" + _describe_divisions(self.roundup_power2_divisions))
        if self.large_segment_size != default.large_segment_size:
            parts.append(f"large_segment_size_mb:{self.large_segment_size // MiB}")
        if self.segment_size:
            parts.append(f"segment_size_mb:{self.segment_size // MiB}")
        if self.per_process_memory_fraction is not None:
            parts.append(f"per_process_memory_fraction:{self.per_process_memory_fraction:g}")
        if self.flavour == "npu":
            if self.base_addr_aligned_kb != default.base_addr_aligned_kb:
                parts.append(f"base_addr_aligned_kb:{self.base_addr_aligned_kb}")
            if self.page_size_1g:
                parts.append("page_size:1g")
            if self.multi_stream_lazy_reclaim:
                parts.append("multi_stream_lazy_reclaim:True")
        if self.release_lock_on_malloc:
            parts.append(("release_lock_on_cudamalloc" if self.flavour == "cuda"
                          else "release_lock_on_npumalloc") + ":True")
        return ",".join(parts)


def _describe_divisions(divisions: tuple) -> str:
    """The shortest text c10's parser reads back as `divisions`: the first interval named
    also fills the ones below it, and `>` fills the ones above the last one named."""
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
        items.append(f">:{divisions[-1]}")
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
    def __init__(self, text: str, source: str, flavour: str):
        self.items, self.i, self.source = _lex(text), 0, source
        self.who = "torch_npu" if flavour == "npu" else "PyTorch"

    def fail(self, message: str) -> InvalidParamError:
        return InvalidParamError(f"{self.source}: {message}")

    def refuse(self, rule: str, got) -> InvalidParamError:
        """A value PyTorch (or torch_npu) stops on at startup."""
        return self.fail(f"{rule}, got {got!r} ({self.who} stops on it too)")

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
        raise tokens.refuse(f"{key} takes a whole number", text)
    return int(text)


def _megabytes(tokens: _Tokens, key: str, low: int, high: int | None = None) -> int:
    """A size in MiB within [low, high], as bytes."""
    value = _int(tokens, key)
    if value < low or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise tokens.refuse(f"{key} must be {bounds} (MiB)", value)
    return value * MiB


def _fraction(tokens: _Tokens, key: str, closed: bool) -> float:
    """A number in [0, 1] (`closed`), else in (0, 1)."""
    text = tokens.take()
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 <= value <= 1 if closed else 0 < value < 1):
        raise tokens.refuse(f"{key} must be in {'[0, 1]' if closed else '(0, 1)'}", text)
    return value


def _bool(tokens: _Tokens, key: str) -> bool:
    text = tokens.take()
    if text not in ("True", "False"):
        raise tokens.refuse(f"{key} takes True or False (capitalised)", text)
    return text == "True"


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _divisions(tokens: _Tokens) -> tuple:
    """The single-number form, or `[256:1,512:2,>:8]` with interval starts in MiB."""
    first = tokens.take()
    if first != "[":
        if not first.isdigit() or not _power_of_two(int(first)):
            raise tokens.refuse("roundup_power2_divisions must be a power of 2 (1 leaves sizes "
                                "unrounded, as 0 does in the list form [>:0])", first)
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
            raise tokens.refuse("roundup_power2_divisions: each count must be 0 or a power of 2",
                                value)
        if start == ">":
            # as c10 (2.9 on) and torch_npu do: from the interval after the last one named
            values[last_index + 1:] = [value] * (INTERVALS - last_index - 1)
        else:
            if not start.isdigit() or not _power_of_two(int(start)):
                raise tokens.refuse("roundup_power2_divisions: interval starts must be powers of "
                                    "2 (MiB)", start)
            index = min(int(start).bit_length() - 1, INTERVALS - 1)
            if first_value:
                values[:index] = [value] * index
                first_value = False
            values[index] = value
            last_index = index
        following = tokens.take("]" if not tokens.more() else None)
        if following == "]":
            break
        if following != ",":
            raise tokens.fail(f"roundup_power2_divisions: expected ',' or ']', got {following!r}")
    return tuple(values)


def _unknown_key(tokens: _Tokens, key: str, flavour: str) -> InvalidParamError:
    """PyTorch (and torch_npu) stop at startup on a key they do not know; say which keys exist."""
    other = "npu" if flavour == "cuda" else "cuda"
    if key in KEYS[other]:
        hint = f" (it is a {ENV_NAME[other]} key)"
    else:
        close = difflib.get_close_matches(key, KEYS[flavour], 1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    return tokens.fail(f"unknown key {key!r}{hint}: {tokens.who} stops at startup on a key it "
                       f"does not recognise; the keys are {', '.join(sorted(KEYS[flavour]))}")


def parse_config(text: str | None, flavour: str = "cuda",
                 base: TorchAllocatorConfig | None = None,
                 source: str | None = None) -> TorchAllocatorConfig:
    """Settings from PyTorch's `key:value,...` text, on top of `base` (default: PyTorch's
    defaults), checked as PyTorch and torch_npu check them: an unknown key or a bad value
    raises InvalidParamError (naming the keys, or the rule); `source` labels the messages
    (default: the flavour's variable). What torch_npu only warns about goes to `notes`."""
    config = base or TorchAllocatorConfig(flavour)
    flavour = config.flavour
    tokens = _Tokens(text or "", source or ENV_NAME[flavour], flavour)
    changes: dict = {}
    notes = list(config.notes)
    floor = LARGE_BUFFER                  # c10's least max_split_size: its large segment size
    while tokens.more():
        key = tokens.take()
        if key not in KEYS[flavour]:
            raise _unknown_key(tokens, key, flavour)
        if not tokens.more():
            raise tokens.fail(f"{key} has no value: write {key}:VALUE")
        tokens.take(":")
        if key == "max_split_size_mb":
            changes["max_split_size"] = _megabytes(tokens, key, 0)     # checked below
        elif key == "max_non_split_rounding_mb":
            changes["max_non_split_rounding_size"] = _megabytes(tokens, key, 0)
        elif key == "garbage_collection_threshold":
            changes["garbage_collection_threshold"] = _fraction(tokens, key, closed=False)
        elif key == "roundup_power2_divisions":
            changes["roundup_power2_divisions"] = _divisions(tokens)
        elif key == "expandable_segments":
            changes["expandable_segments"] = _bool(tokens, key)
        elif key in ("release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
                     "release_lock_on_npumalloc"):
            changes["release_lock_on_malloc"] = _bool(tokens, key)
        elif key == "backend":
            value = tokens.take()
            if value not in ("native", "cudaMallocAsync"):
                raise tokens.refuse("backend takes native or cudaMallocAsync", value)
            if value != "native":
                raise tokens.fail(f"backend:{value} hands memory to the driver's own pool, which "
                                  "npumem does not model; only backend:native is replayed")
        elif key == "large_segment_size_mb":
            changes["large_segment_size"] = floor = _megabytes(tokens, key, 11)   # c10: > 10
        elif key == "segment_size_mb":        # NPUAllocatorConfig.cpp parseSegmentSizeMb l.189
            changes["segment_size"] = _megabytes(tokens, key, 20, 512)
            notes.append("torch_npu warns that segment_size_mb is deprecated: use "
                         "large_segment_size_mb")
        elif key == "base_addr_aligned_kb":
            text = tokens.take()
            # NPUAllocatorConfig::parseAddrAlignSize: digits only, no leading zero, [0, 16]
            if not text.isdigit() or str(int(text)) != text or int(text) > 16:
                raise tokens.refuse("base_addr_aligned_kb must be in [0, 16], written without "
                                    "leading zeros", text)
            changes["base_addr_aligned_kb"] = int(text)
        elif key == "page_size":              # NPUAllocatorConfig.cpp parsePageSize l.177
            value = tokens.take()
            if value != "1g":
                raise tokens.refuse("page_size takes 1g only", value)
            changes["page_size_1g"] = True
        elif key == "per_process_memory_fraction":
            changes["per_process_memory_fraction"] = _fraction(tokens, key, closed=True)
        elif key == "multi_stream_lazy_reclaim":
            changes["multi_stream_lazy_reclaim"] = _bool(tokens, key)
        elif key in _BOOLS:
            _bool(tokens, key)
        elif key == "pinned_num_register_threads":
            value = _int(tokens, key)
            if not _power_of_two(value) or value > 128:
                raise tokens.refuse(f"{key} must be a power of 2 up to 128", value)
        else:                                   # host-memory sizes: no placement effect
            _int(tokens, key)
        if tokens.more():
            tokens.take(",")
    for field_name, key in (("max_split_size", "max_split_size_mb"),
                            ("max_non_split_rounding_size", "max_non_split_rounding_mb")):
        if changes.get(field_name, floor) < floor:     # whichever of the two came first
            raise tokens.refuse(f"{key} must be >= {floor // MiB} (MiB, the large segment size)",
                                changes[field_name] // MiB)
    if "large_segment_size" in changes and "max_non_split_rounding_size" not in changes:
        # AcceleratorAllocatorConfig::parseArgs reads large_segment_size_mb first and makes it
        # the default of max_non_split_rounding_size
        changes["max_non_split_rounding_size"] = changes["large_segment_size"]
    configured = config.replace(**changes)
    if flavour == "npu":
        notes += _npu_setting_notes(configured, changes)
    # NPUAllocatorConfig.cpp parseArgs l.306-311: checked after every key is read
    if flavour == "npu" and configured.expandable_segments and (
            configured.max_split_size != NO_LIMIT or configured.garbage_collection_threshold):
        raise tokens.fail("torch_npu refuses max_split_size_mb or garbage_collection_threshold "
                          "together with expandable_segments:True; set expandable_segments:False")
    joined = ",".join(filter(None, [config.text, (text or "").strip()]))
    return configured.replace(text=joined, notes=tuple(dict.fromkeys(notes)))


def _npu_setting_notes(config: TorchAllocatorConfig, changes: dict) -> list[str]:
    """What torch_npu's NPUAllocatorConfig::parseArgs warns about and goes on (l.355-369;
    page_size:1g's versions: NPUCachingAllocator.cpp IsMallocPage1GMem l.130)."""
    notes = []
    if "segment_size" in changes and config.large_segment_size != LARGE_BUFFER:
        notes.append("torch_npu warns that both segment_size_mb and large_segment_size_mb are "
                     "set: large_segment_size_mb wins, segment_size_mb is ignored")
    if config.page_size_1g:
        if config.large_segment_size != LARGE_BUFFER or config.segment_size:
            notes.append("torch_npu warns that page_size:1g overrides large_segment_size_mb and "
                         "segment_size_mb for the large pool (1 GiB segments and pages)")
        notes.append("page_size:1g takes effect with CANN 8.1.RC1 and driver 25.0.RC1 or newer; "
                     "older ones warn and fall back to 2 MiB huge pages (the replay assumes 1 GiB)")
    if config.multi_stream_lazy_reclaim:
        notes.append("multi_stream_lazy_reclaim:True only delays when blocks used on other "
                     "streams return to the cache; a replay frees them where the recording does")
    return notes


# The SoC names torch_npu's SetSocVersion accepts (NpuVariables.cpp), besides "Ascend950..."
SOC_NAMES = ("Ascend910PremiumA", "Ascend910ProA", "Ascend910A", "Ascend910ProB", "Ascend910B",
             "Ascend310P1", "Ascend310P2", "Ascend310P3", "Ascend310P4", "Ascend310P5",
             "Ascend310P7", "Ascend910B1", "Ascend910B2", "Ascend910B2C", "Ascend910B3",
             "Ascend910B4", "Ascend910B4-1", "Ascend310B1", "Ascend310B2", "Ascend310B3",
             "Ascend310B4", "Ascend910_9391", "Ascend910_9392", "Ascend910_9381",
             "Ascend910_9382", "Ascend910_9372", "Ascend910_9362", "Ascend910_9363")


def npu_pad(soc: str = "Ascend910B3", cann: str = "8.5.0") -> int:
    """The bytes torch_npu adds to every request before rounding (AddPadSize in
    NPUCachingAllocator.cpp): 32, except on an Ascend950 (any SoC name starting so, as
    SetSocVersion reads it) with CANN 9.1.0 or newer (kMinDel32PaddingSizeCannVersion), from
    the torch_npu 26.1.0 releases on. CANN versions order as X.Y.RCn < X.Y.0 <= X.Y.Z."""
    if soc not in SOC_NAMES and not soc.startswith("Ascend950"):
        close = difflib.get_close_matches(soc, SOC_NAMES + ("Ascend950PR",), 1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InvalidParamError(f"SoC {soc!r}{hint}: torch_npu knows {', '.join(SOC_NAMES)} "
                                "and Ascend950*")
    newer = _cann_version(cann) >= (9, 1, 1, 0)
    return 0 if soc.startswith("Ascend950") and newer else 32


def _cann_version(text: str) -> tuple:
    """(major, minor, 0 for an RC / 1 for a release, number) of `8.1.RC1` or `9.1.0`."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(?:RC(\d+)|(\d+))(?:\.\w+)?", text.strip())
    if not match:
        raise InvalidParamError(f"CANN version {text!r}: write it as CANN does, e.g. 8.1.RC1 "
                                "or 9.1.0")
    major, minor, rc, patch = match.groups()
    return (int(major), int(minor), 0 if rc else 1, int(rc or patch))


def config_warnings(config: TorchAllocatorConfig) -> list[str]:
    """What to tell a person about these settings: the notes from reading them, and
    combinations that PyTorch or torch_npu document to do nothing or to fail."""
    notes = list(config.notes)
    npu = config.flavour == "npu"
    if config.garbage_collection_threshold and config.per_process_memory_fraction is None:
        call = "torch.npu" if npu else "torch.cuda"
        notes.append(f"garbage_collection_threshold:{config.garbage_collection_threshold:g} has "
                     "no effect: PyTorch collects only under a memory fraction "
                     f"({call}.set_per_process_memory_fraction, or per_process_memory_fraction)")
    if config.per_process_memory_fraction == 0:
        notes.append("per_process_memory_fraction:0 leaves PyTorch no memory: every allocation "
                     "fails")
    if not npu and config.expandable_segments and (
            config.max_split_size != NO_LIMIT or config.garbage_collection_threshold):
        notes.append("torch_npu refuses max_split_size_mb or garbage_collection_threshold with "
                     "expandable_segments:True; CUDA takes them")
    if npu and not config.expandable_segments and config.base_addr_aligned_kb != 16:
        notes.append("base_addr_aligned_kb acts only with expandable_segments:True")
    return notes


def env_names(flavour: str = "cuda", torch_version: str | None = None) -> tuple[str, ...]:
    """The variables PyTorch reads its settings from, in order: the first one set wins.

    c10/core/AllocatorConfig.cpp: PyTorch 2.9 to 2.11 read PYTORCH_ALLOC_CONF first and warn that
    PYTORCH_CUDA_ALLOC_CONF is deprecated; 2.12 went back to PYTORCH_CUDA_ALLOC_CONF first, as an
    alias, without the warning (2.13 does the same). torch_npu reads PYTORCH_NPU_ALLOC_CONF, else
    PYTORCH_ALLOC_CONF. Without a version: the newest rule."""
    if flavour == "npu":
        return (ENV_NAME["npu"], GENERIC_ENV)
    version = tuple(int(part) for part in re.findall(r"\d+", torch_version or "")[:2])
    if version and version < (2, 9):
        return (ENV_NAME["cuda"],)
    if version and version < (2, 12):
        return (GENERIC_ENV, ENV_NAME["cuda"])
    return (ENV_NAME["cuda"], GENERIC_ENV)


def settings_variable(flavour: str = "cuda", torch_version: str | None = None) -> str:
    """The one variable npumem names when it says what to set or leave unset (tune's answer,
    replay's table, estimate's recommendation): the first one the recording's PyTorch reads,
    so the advice works there without a deprecation warning."""
    return env_names(flavour, torch_version)[0]


def read_env(flavour: str = "cuda", environ=None,
             torch_version: str | None = None) -> tuple[str, str, list[str]]:
    """(variable, text, notes): the settings PyTorch would read from the environment, checked
    with parse_config (an error names the variable). ("", "", []) when none is set. A note says
    when another variable is set and PyTorch does not read it."""
    environ = os.environ if environ is None else environ
    names = env_names(flavour, torch_version)
    chosen = next((name for name in names if name in environ), "")
    if not chosen:
        return "", "", []
    text = environ[chosen]
    parse_config(text, flavour, source=f"the environment's {chosen}={text!r}")
    shadowed = [name for name in names if name in environ and name != chosen
                and environ[name] != text]
    notes = [f"{name} is set too, but PyTorch reads {chosen} first" for name in shadowed]
    return chosen, text, notes


def from_snapshot(settings: dict | None, flavour: str = "cuda") -> TorchAllocatorConfig:
    """The settings a snapshot recorded (`allocator_settings`); defaults where it has none.
    The recorded text is checked too; the run accepted it, so a failure is a note, not an
    error (the recorded values are used either way)."""
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
    name = next((n for n in (ENV_NAME[flavour], GENERIC_ENV) if settings.get(n)), ENV_NAME[flavour])
    text = settings.get(name) if isinstance(settings.get(name), str) else ""
    notes = ()
    if text:
        try:
            parse_config(text, flavour, source=f"the snapshot's {name}={text!r}")
        except InvalidParamError as exc:
            reason = exc.message.split("; the keys are")[0]      # the key list is for typing
            notes = (f"{reason}; the recorded run went ahead with it, so the replay uses the "
                     "values the snapshot recorded",)
    return config.replace(text=text, notes=notes, **changes)
