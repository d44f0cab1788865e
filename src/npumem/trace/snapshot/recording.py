"""A PyTorch memory snapshot as a recording of one device: its trace, its settings, its segments
at the dump, and (start_state.py) the allocator's state at the trace's first entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from ...alloc.torch_model.config import TorchAllocatorConfig, from_snapshot, settings_variable
from .. import jsonl
from ..file_checks import TraceFormatError, shown
from ..textio import bounded_reader, max_snapshot_bytes, read_head
from . import columns as entry_columns
from .columns import SEGMENT_ADD, SEGMENT_REMOVE, holds, indices
from . import json_dict
from .json_form import read_snapshot
from .schema import OOM_KEY, check_snapshot
from .start_state import StartState, rebuild_start

@dataclass
class Recording:
    path: str
    device: int
    flavour: str                         # "cuda" or "npu"
    settings: dict | None                # the snapshot's allocator_settings, if recorded
    segments: list[dict]                 # this device's segments at the dump
    entries: list[dict]                  # this device's trace entries
    annotations: list[dict] = field(default_factory=list)   # its external_annotations
    # A recording made up from another (a run played on past its end): it starts as that did
    continues: "Recording | None" = None
    shared: int = 0                      # its first entries, the same as that one's
    limits: dict | None = None           # what c10 told its OOM observers (OOM_KEY), if kept
    pad: int | None = None               # the target NPU's request padding (npu_pad); None: 32
    recorded_flavour: str | None = None  # the allocator it was recorded on, where not `flavour`
    predicted: bool = False              # written by npumem estimate, not recorded on a device
    read_notes: list[str] = field(default_factory=list)   # what reading it changed (mending)
    # the PyTorch that ran it where known outright (npumem estimate's modelled one); else the
    # entries tell (torch_version)
    torch_release: str | None = None

    def base_config(self) -> TorchAllocatorConfig:
        """The allocator settings this recording ran with, on the chip it is replayed for."""
        config = from_snapshot(self.settings, self.flavour)
        return config if self.pad is None or self.flavour != "npu" else config.replace(pad=self.pad)

    @property
    def torch_version(self) -> str | None:
        """The oldest PyTorch that writes this trace's entries as they are (docs/formats.md:
        `user_metadata` on every entry from 2.10, `pool_id` from 2.12); None when the entries
        do not tell."""
        if self.torch_release is not None:
            return self.torch_release
        actions = [e for e in self.entries[:1000] if e.get("action") == "alloc"]
        if not actions:
            return None
        if all("pool_id" in e for e in actions):
            return "2.12"
        if all("user_metadata" in e for e in actions):
            return "2.10"
        return None

    @property
    def settings_variable(self) -> str:
        """The variable to name in advice about this recording's settings (config.py's
        settings_variable: the one its PyTorch reads first)."""
        return settings_variable(self.flavour, self.torch_version)

    @cached_property
    def free_action(self) -> str:
        """Blocks become reusable at free_completed; old traces only have free_requested."""
        return "free_completed" if holds(self.entries, "free_completed") else "free_requested"

    def recorded_segment_events(self) -> list[dict]:
        return [self.entries[i] for i in indices(self.entries, *SEGMENT_ADD, *SEGMENT_REMOVE)]

    def start_state(self, config: TorchAllocatorConfig | None = None,
                    pools: bool = True) -> StartState:
        """The allocator's state at the first entry (start_state.rebuild_start); `pools`
        False: without inferring which pool served each request (blocks and segments only)."""
        if self.continues is not None:
            return self.continues.start_state(config, pools)
        return rebuild_start(self, config or self.base_config(), pools)

    def refuse_if_damaged(self) -> None:
        """A TraceFormatError for an allocation, segment or mapping that succeeded with more
        bytes than any device holds (columns.impossible_grant): what is replayed, planned or
        converted from it would not hold (a model with no memory limit calls it a fit)."""
        damaged = entry_columns.impossible_grant(self.entries)
        if damaged is not None:
            raise TraceFormatError(self.path, f"entry {damaged[0]}", damaged[1])

    @classmethod
    def from_events(cls, path: str, events, flavour: str = "cuda") -> "Recording":
        """A trace without a snapshot's segments (JSONL, RMM, msprof, ...): it starts empty."""
        return cls.from_entries(path, entry_columns.from_events(events), flavour)

    @classmethod
    def from_entries(cls, path: str, entries, flavour: str = "cuda") -> "Recording":
        """As from_events, of the events read as entries already (formats.read_mended)."""
        return cls(path, 0, flavour, None, [], entries)


def first_oom(entries) -> int | None:
    """The index of a device trace's first `oom` entry; None if it has none."""
    found = indices(entries or [], "oom")
    return found[0] if len(found) else None


def died_at(entries) -> int | None:
    """The first `oom` entry, where the run ended on it: no allocation follows it (the frees of
    the exception's unwinding may). None when it never ran out, or caught it and went on."""
    index = first_oom(entries)
    if index is None or holds(entries[index + 1:], "alloc"):
        return None
    return index


def load_data(path: str) -> dict:
    """The snapshot's dict, read without running code (or from a JSONL file that holds a whole
    snapshot), its shape checked; TraceFormatError when it is not one. Each device trace is an
    `entry_columns.Entries`: the entries as columns, a dict each when asked for."""
    head = read_head(path, 4096)
    if jsonl.holds_snapshot(head):
        return check_snapshot(read_snapshot(path), path)
    if json_dict.sniff(head):                  # json.dump of a snapshot dict
        return json_dict.load(path)
    if entry_columns.native is None:
        raise TraceFormatError(path, "", entry_columns.NOT_BUILT)
    try:
        with bounded_reader(path, max_snapshot_bytes()) as reader:
            data, devices, _ = entry_columns.load_pickle(reader, shown)
    except entry_columns.UnsafePickle as exc:
        raise TraceFormatError(path, "", f"not a readable snapshot pickle: {exc}") from None
    except entry_columns.EntryError as exc:
        raise TraceFormatError(path, exc.where, exc.reason) from None
    if devices:
        traces = data.get("device_traces") if isinstance(data, dict) else None
        if not (isinstance(traces, list) and len(traces) == len(devices)
                and all(isinstance(trace, list) and not trace for trace in traces)):
            raise TraceFormatError(path, "device_traces", "not laid out as pickle.dump writes "
                                   "a snapshot (a list of one list of entries per device)")
        data["device_traces"] = devices
    return check_snapshot(data, path)


def _guess_flavour(data: dict, segments: list[dict], entries: list[dict]) -> str:
    settings = data.get("allocator_settings")
    if isinstance(settings, dict) and "PYTORCH_NPU_ALLOC_CONF" in settings:
        return "npu"
    for item in segments[:20] + entries[:200]:
        for frame in (item.get("frames") or [])[:12]:
            text = f"{frame.get('name', '')} {frame.get('filename', '')}"
            if "NPUCachingAllocator" in text or "torch_npu" in text or "c10_npu" in text:
                return "npu"
    return "cuda"


def load_recording(path: str, device: int | None = None, flavour: str | None = None) -> Recording:
    """One device of a snapshot (default: the first that ran out of memory, else the first
    with trace entries, else with segments)."""
    return recording_from_data(load_data(path), path, device, flavour)


def recording_from_data(data: dict, path: str = "<snapshot>", device: int | None = None,
                        flavour: str | None = None) -> Recording:
    """One device of an already loaded snapshot dict (default: the first that ran out of
    memory, else the first with trace entries, else with segments)."""
    traces = data.get("device_traces")
    traces = traces if isinstance(traces, list) else []
    segments = [s for s in data.get("segments", []) if isinstance(s, dict)]
    with_entries = [i for i, trace in enumerate(traces) if trace]
    with_segments = sorted({s.get("device", 0) for s in segments})
    chosen = device is None
    if device is None:
        if not with_entries and not with_segments:
            raise TraceFormatError(path, "device_traces", "every device trace is empty and no "
                                   "segment is cached: the snapshot holds nothing")
        died = [i for i in with_entries if first_oom(traces[i]) is not None]
        device = (died or with_entries or with_segments)[0]     # the one that ran out, first
    if device not in with_entries and device not in with_segments:
        raise TraceFormatError(path, "device_traces", f"no device {device}; devices with events: "
                               f"{with_entries}, with segments: {with_segments}")
    entries = traces[device] if device < len(traces) and isinstance(
        traces[device], (list, entry_columns.Entries)) else []
    mine = [s for s in segments if s.get("device", 0) == device]
    settings = data.get("allocator_settings")
    annotations = data.get("external_annotations")
    if not isinstance(annotations, list):
        annotations = []
    annotations = [annotation for annotation in annotations
                   if isinstance(annotation, dict) and annotation.get("device", device) == device]
    limits = data.get(OOM_KEY)
    entries, mine, workspaces = _without_workspaces(entries, mine)
    native = "npu" if workspaces else _guess_flavour(data, mine, entries)
    others = [i for i in with_entries if i != device] if chosen else []
    notes = [f"device {device} replayed; the snapshot also records device(s) "
             f"{', '.join(map(str, others))} (`npumem report` shows every device)"] if others else []
    return Recording(path, device, flavour or native,
                     settings if isinstance(settings, dict) else None, mine, entries, annotations,
                     limits=limits if isinstance(limits, dict) and limits.get("device") == device
                     else None, recorded_flavour=native if flavour not in (None, native) else None,
                     predicted=str((data.get("npumem") or {}).get("source", "")).startswith(
                         "npumem estimate"), read_notes=notes)


def _without_workspaces(entries: list, segments: list) -> tuple[list, list, bool]:
    """The entries and segments of the caching allocator alone. torch_npu's snapshot puts each
    block of its workspace allocator (a separate allocator) at the front of the trace, as
    `workspace_snapshot`, `segment_alloc` and `alloc` of one address, and its segment among
    the segments."""
    if not holds(entries, "workspace_snapshot"):
        return entries, segments, False
    pending: dict[int, set] = {}
    kept = []
    for entry in entries:
        action, addr = entry.get("action"), entry.get("addr")
        if action == "workspace_snapshot":
            pending[addr] = {"segment_alloc", "alloc"}
        elif action in pending.get(addr, ()):
            pending[addr].discard(action)
        else:
            kept.append(entry)
    if not pending:
        return entries, segments, False
    return kept, [s for s in segments if s.get("address") not in pending], True
