"""Memory snapshots in exactly the shape PyTorch (and torch_npu) write them, version by version,
built from the table in docs/formats.md ("PyTorch memory snapshots, as PyTorch writes them"),
not from npumem's own writer.

`torch.cuda.memory._dump_snapshot()` pickles the dict that torch/csrc/cuda/Module.cpp
(THCPModule_memorySnapshot) builds; torch_npu's `_dump_snapshot()` pickles the one
torch_npu/csrc/npu/Module.cpp (THNPModule_memorySnapshot) builds. Both insert keys in a fixed
order, and the dicts here are built in that order, with the same Python types (tuples for pool
ids, ints, bools, floats, strings).

The helpers (`alloc_entry`, `oom_entry`, `segment`, `block`, ...) describe what happened; `build`
writes it down as `version` would: the keys that version has, in its order, and no other:

    snap = build("2.12", segments=[segment(BASE, [block(8 * MiB), block(12 * MiB, "inactive")])],
                 entries=[alloc_entry(BASE, 8 * MiB, time_us=1), oom_entry(64 * MiB, 10 * MiB)])

`scenario(version)` is a small realistic run: blocks cached before the trace began, allocations
and frees, segment allocations, an earlier snapshot's marker, and a real out-of-memory (the
retry's `segment_free` entries, then the `oom` entry), with the segments as they are at the dump.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KiB, MiB = 1 << 10, 1 << 20

# Shapes that differ, each named by the first release that writes it (see docs/formats.md).
VERSIONS = ("2.1", "2.2", "2.3", "2.5", "2.8", "2.10", "2.12", "2.14", "torch_npu")
NEWEST = "2.14"
# The releases each shape covers.
COVERS = {"2.1": "2.1", "2.2": "2.2", "2.3": "2.3-2.4", "2.5": "2.5-2.7", "2.8": "2.8-2.9",
          "2.10": "2.10-2.11", "2.12": "2.12-2.13", "2.14": "2.14", "torch_npu": "torch_npu"}

# c10's allocator constants (CUDACachingAllocator.cpp; torch_npu's NPUCachingAllocator has the
# same ones and pads every request by 32 bytes before rounding).
MIN_BLOCK = 512
SMALL_SIZE = 1 * MiB            # requests up to this come from 2 MiB segments
SMALL_BUFFER = 2 * MiB
LARGE_BUFFER = 20 * MiB         # requests under 10 MiB come from 20 MiB segments
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB

# An x86-64 process's heap addresses, as cudaMalloc returns them.
BASE = 0x7F3A_4000_0000
NPU_STREAM = 0xAAAA_E1C3_A0B0   # torch_npu's streams are aclrtStream pointers, never 0


def _version_key(version: str) -> tuple[int, int]:
    if version == "torch_npu":
        return (0, 0)
    major, minor = version.split(".")[:2]
    return (int(major), int(minor))


@dataclass(frozen=True)
class Shape:
    """What one version writes."""
    name: str
    npu: bool
    time_us: bool                 # trace entries: epoch microseconds (2.2)
    allocator_settings: bool      # top level (2.3)
    external_annotations: bool    # top level, always written once present (2.5)
    compile_context: bool         # trace entries: a string, "N/A" outside compiled regions (2.8)
    user_metadata: bool           # trace entries: a string, "" unless set (2.10)
    stream_reuse_setting: bool    # allocator_settings.graph_capture_record_stream_reuse (2.10)
    pool_id: bool                 # trace entries: (int, int) (2.12)
    actions: tuple = field(default=())

    @property
    def alloc_conf(self) -> str:
        return "PYTORCH_NPU_ALLOC_CONF" if self.npu else "PYTORCH_CUDA_ALLOC_CONF"


_CUDA_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                 "segment_map", "segment_unmap", "oom", "snapshot")


def shape(version: str) -> Shape:
    if version == "torch_npu":
        return Shape("torch_npu", True, False, False, False, False, False, False, False,
                     _CUDA_ACTIONS + ("workspace_snapshot",))
    v = _version_key(version)
    if v < (2, 1):
        raise ValueError(f"snapshots before 2.1 (blocks with 'history') are not built: {version}")
    return Shape(version, False, v >= (2, 2), v >= (2, 3), v >= (2, 5), v >= (2, 8), v >= (2, 10),
                 v >= (2, 10), v >= (2, 12),
                 _CUDA_ACTIONS + (("annotate",) if v >= (2, 14) else ()))


def shape_for(version: str) -> str:
    """The shape name (one of VERSIONS) that a release such as "2.7" or "2.13" writes."""
    if version == "torch_npu":
        return version
    v = _version_key(version)
    named = [name for name in VERSIONS if name != "torch_npu" and _version_key(name) <= v]
    if not named:
        raise ValueError(f"no shape for {version}")
    return named[-1]


# -- what happened: version-free descriptions ---------------------------------------------------

@dataclass
class Entry:
    action: str
    addr: int = 0                 # device_free for an oom
    size: int = 0
    stream: int = 0
    time_us: int | None = None    # filled in by build() when None
    frames: list | None = None    # None: recorded without context (no 'frames' key)
    compile_context: str = "N/A"
    user_metadata: str = ""
    pool_id: tuple = (0, 0)


def alloc_entry(addr, size, stream=0, time_us=None, frames=None, **kw) -> Entry:
    """`size` is the size asked for (c10 records orig_size, not the rounded block size)."""
    return Entry("alloc", addr, size, stream, time_us, frames, **kw)


def free_entries(addr, size, stream=0, time_us=None, frames=None, **kw) -> list[Entry]:
    """A free as c10 records it: free_requested then free_completed, both with the size that was
    asked for at allocation (block->requested_size)."""
    return [Entry("free_requested", addr, size, stream, time_us, frames, **kw),
            Entry("free_completed", addr, size, stream,
                  None if time_us is None else time_us + 1, frames, **kw)]


def segment_alloc_entry(addr, size, stream=0, time_us=None, frames=None, **kw) -> Entry:
    return Entry("segment_alloc", addr, size, stream, time_us, frames, **kw)


def segment_free_entry(addr, size, stream=0, time_us=None, frames=None, **kw) -> Entry:
    return Entry("segment_free", addr, size, stream, time_us, frames, **kw)


def segment_map_entry(addr, size, stream=0, time_us=None, frames=None, **kw) -> Entry:
    return Entry("segment_map", addr, size, stream, time_us, frames, **kw)


def segment_unmap_entry(addr, size, stream=0, time_us=None, frames=None, **kw) -> Entry:
    return Entry("segment_unmap", addr, size, stream, time_us, frames, **kw)


def oom_entry(size, device_free, stream=0, time_us=None, frames=None, **kw) -> Entry:
    """`size`: the rounded request (c10 records params.size(), round_size of what was asked);
    `device_free`: what cudaMemGetInfo reported after the retry had emptied the cache."""
    return Entry("oom", device_free, size, stream, time_us, frames, **kw)


def snapshot_entry(total_active, time_us=None, stream=0, **kw) -> Entry:
    """The marker an earlier `_snapshot()` / `memory_snapshot()` left: addr 0, the active bytes of
    every segment then, never frames."""
    return Entry("snapshot", 0, total_active, stream, time_us, None, **kw)


def annotate_entry(addr, size, metadata, stream=0, time_us=None, frames=None, **kw) -> Entry:
    """2.14's `_annotate_tensor` marker: the allocation's base address, the note in
    user_metadata (the size it carries is unverified; the allocation's is used)."""
    return Entry("annotate", addr, size, stream, time_us, frames, user_metadata=metadata, **kw)


def workspace_snapshot_entries(addr, size, stream, frames=None) -> list[Entry]:
    """torch_npu: what each workspace block (one per stream) puts at the front of the trace when
    a snapshot is taken: workspace_snapshot, segment_alloc and alloc of the whole block."""
    return [Entry(action, addr, size, stream, 0, frames)
            for action in ("workspace_snapshot", "segment_alloc", "alloc")]


@dataclass
class Block:
    size: int
    state: str = "active_allocated"   # or "active_pending_free", "inactive"
    requested_size: int | None = None  # None: size when allocated, 0 when inactive
    frames: list = field(default_factory=list)   # [] : allocated before history was recorded


def block(size, state="active_allocated", requested_size=None, frames=None) -> Block:
    return Block(size, state, requested_size, frames if frames is not None else [])


@dataclass
class Segment:
    address: int
    blocks: list
    stream: int = 0
    device: int = 0
    pool_id: tuple = (0, 0)
    expandable: bool = False
    frames: list = field(default_factory=list)
    small: bool | None = None        # None: from the size (2 MiB segments are the small pool's)

    @property
    def total_size(self) -> int:
        return sum(b.size for b in self.blocks)


def segment(address, blocks, stream=0, device=0, pool_id=(0, 0), expandable=False, frames=None,
            small=None) -> Segment:
    return Segment(address, list(blocks), stream, device, pool_id, expandable,
                   frames if frames is not None else [], small)


@dataclass
class Annotation:
    """A record_function range edge (2.5+ external_annotations)."""
    stage: str
    name: str
    time_us: int
    device: int = 0


# -- how a version writes it down ---------------------------------------------------------------

def _requested(b: Block) -> int:
    if b.requested_size is not None:
        return b.requested_size
    return 0 if b.state == "inactive" else b.size


def _block_dict(b: Block, address: int) -> dict:
    out = {"address": address, "size": b.size, "requested_size": _requested(b), "state": b.state}
    out["frames"] = list(b.frames)     # last either way: empty at once, or after symbolizing
    return out


def _segment_dict(s: Segment, sh: Shape) -> dict:
    allocated = sum(b.size for b in s.blocks if b.state == "active_allocated")
    active = [b for b in s.blocks if b.state != "inactive"]
    small = s.small if s.small is not None else s.total_size <= SMALL_BUFFER and not s.expandable
    out = {"device": s.device, "address": s.address, "total_size": s.total_size,
           "allocated_size": allocated, "active_size": sum(b.size for b in active),
           "requested_size": sum(_requested(b) for b in active), "stream": s.stream}
    kind = "small" if small else "large"
    if sh.npu:          # torch_npu writes the pool id before the type
        out["segment_pool_id"] = tuple(s.pool_id)
        out["segment_type"] = kind
    else:
        out["segment_type"] = kind
        out["segment_pool_id"] = tuple(s.pool_id)
    out["is_expandable"] = s.expandable
    if not s.frames:    # no context: [] inserted in place; a stack is added after the blocks
        out["frames"] = []
    blocks, address = [], s.address
    for b in s.blocks:
        blocks.append(_block_dict(b, address))
        address += b.size
    out["blocks"] = blocks
    if s.frames:
        out["frames"] = list(s.frames)
    return out


def _entry_dict(e: Entry, sh: Shape) -> dict:
    if e.action not in sh.actions:
        raise ValueError(f"{sh.name} never writes a {e.action!r} entry")
    out = {"action": e.action, ("device_free" if e.action == "oom" else "addr"): e.addr,
           "size": e.size, "stream": e.stream}
    if sh.time_us:
        out["time_us"] = e.time_us
    if sh.compile_context:
        out["compile_context"] = e.compile_context
    if sh.user_metadata:
        out["user_metadata"] = e.user_metadata
    if sh.pool_id:
        out["pool_id"] = tuple(e.pool_id)
    if e.frames is not None and e.action != "snapshot":
        out["frames"] = list(e.frames)      # symbolized last, so the last key
    return out


def allocator_settings(sh: Shape, conf: str = "", max_split_size: int = -1,
                       expandable_segments: bool = False, divisions=None) -> dict:
    """What CUDAAllocatorConfig reports; -1 is SIZE_MAX (no max_split_size_mb) as int64."""
    out = {sh.alloc_conf: conf, "max_split_size": max_split_size,
           "garbage_collection_threshold": 0.0, "expandable_segments": expandable_segments,
           "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
           "pinned_use_cuda_host_register": False}
    if sh.stream_reuse_setting:
        out["graph_capture_record_stream_reuse"] = False
    divisions = divisions or {}
    out["roundup_power2_divisions"] = {str(1 << i): int(divisions.get(1 << i, 0))
                                       for i in range(16)}
    return out


def build(version: str = NEWEST, segments=(), entries=(), devices: int = 1, annotations=(),
          settings: dict | None = None, start_us: int = 1_718_000_000_000_000) -> dict:
    """The snapshot `version` writes for these segments and trace entries (device 0's; other
    devices get empty traces). Entries without a time get increasing times from `start_us`."""
    sh = shape(version)
    flat: list[Entry] = []
    for item in entries:
        flat.extend(item if isinstance(item, list) else [item])
    clock = start_us
    for e in flat:
        if e.time_us is None:
            clock += 7
            e.time_us = clock
        else:
            clock = max(clock, e.time_us)
    traces = [[_entry_dict(e, sh) for e in flat]] + [[] for _ in range(devices - 1)]
    out = {"segments": [_segment_dict(s, sh) for s in sorted(segments, key=lambda s: s.address)],
           "device_traces": traces}
    if sh.allocator_settings:
        out["allocator_settings"] = allocator_settings(sh, **(settings or {}))
    if sh.external_annotations:
        out["external_annotations"] = [
            {"stage": a.stage, "name": a.name, "device": a.device, "time_us": a.time_us}
            for a in annotations]
    return out


# -- stacks -------------------------------------------------------------------------------------

def python_frames(line: int = 42) -> list[dict]:
    """stacks="python": Python frames only, innermost first."""
    return [{"name": "forward", "filename": "/home/user/project/model.py", "line": line},
            {"name": "_call_impl", "filename": "/usr/lib/python3.11/site-packages/torch/nn/"
             "modules/module.py", "line": 1541},
            {"name": "train_step", "filename": "/home/user/project/train.py", "line": 88},
            {"name": "<module>", "filename": "/home/user/project/train.py", "line": 120}]


def all_frames(line: int = 42) -> list[dict]:
    """stacks="all": the unwinder's C++ frames (filename '??' or '', line 0) around the Python
    ones, and a Python frame whose line is unknown (-1 as an unsigned 64-bit number)."""
    cpp = [{"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
           {"name": "torch::CapturedTraceback::gather(bool, bool, bool)", "filename": "??",
            "line": 0},
           {"name": "torch::cuda::(anonymous namespace)::gather_with_cpp()",
            "filename": "memory_snapshot.cpp", "line": 0},
           {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc("
            "signed char, unsigned long, CUstream_st*)", "filename": "CUDACachingAllocator.cpp",
            "line": 0},
           {"name": "at::native::empty_cuda(c10::ArrayRef<long>, ...)", "filename": "", "line": 0},
           {"name": "_PyEval_EvalFrameDefault", "filename": "??", "line": 0}]
    unknown_line = {"name": "init_gpu_context", "filename": "/usr/lib/python3.11/site-packages/"
                    "torch/_subclasses/fake_tensor.py", "line": (1 << 64) - 1}
    return cpp + [python_frames(line)[0], unknown_line] + python_frames(line)[1:] + [
        {"name": "__libc_start_main", "filename": "", "line": 0},
        {"name": "_start", "filename": "??", "line": 0}]


# -- a realistic run ----------------------------------------------------------------------------

def round_size(size: int, npu: bool = False) -> int:
    """c10's round_size without roundup_power2_divisions; torch_npu pads by 32 bytes first."""
    size = size + 32 if npu else size
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def allocation_size(size: int) -> int:
    """The segment c10 asks the driver for to hold a (rounded) block of `size`."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass
class Scenario:
    snapshot: dict
    oom_size: int          # the oom entry's size (rounded request)
    device_free: int       # the oom entry's device_free
    asked: int             # what the program asked for


def scenario(version: str = NEWEST, stacks: str | None = "python", context: str | None = "all",
             devices: int = 1) -> Scenario:
    """A run as `version` records it with _record_memory_history(context=..., stacks=...):

    before the trace: a 20 MiB segment S0 holding an 8 MiB tensor (allocated before recording,
    so its block and segment have no frames) and 12 MiB cached free;
    in the trace: 4 MiB from S0 (split), a snapshot marker, a 2 MiB small segment S1 for a
    1000-byte tensor that is freed, a 20 MiB segment S3 for a 9 MiB tensor that stays, a 30 MiB
    segment S2 for a tensor that is freed, then a request for 60 MiB + 1: the cache has no
    block, cudaMalloc fails, c10 releases every unsplit free segment (S2 from the large pool,
    then S1 from the small pool: segment_free entries; S0 and S3 are split, so kept), cudaMalloc
    fails again, and the `oom` entry records the rounded request and the driver's free bytes;
    the snapshot is dumped there (an OOM observer), holding S0 and S3.

    context: "all" (frames on every entry), "alloc" (frees carry the allocation's stack),
    "state" (no frames on trace entries), None (no frames anywhere).
    stacks: "python" or "all" (C++ frames too).
    """
    sh = shape(version)
    npu = sh.npu
    stream = NPU_STREAM if npu else 0
    frames_of = all_frames if stacks == "all" else python_frames

    def trace_frames(line):
        return frames_of(line) if context in ("all", "alloc") else None

    def block_frames(line):
        return frames_of(line) if context is not None else []

    s0, s1, s2, s3 = BASE, BASE + 0x4000_0000, BASE + 0x8000_0000, BASE + 0x2000_0000
    t = 1_718_000_000_000_000
    kw = {} if not sh.pool_id else {"pool_id": (0, 0)}
    entries: list = []
    if npu:     # the workspace block, put at the front when the snapshot is taken
        ws = BASE + 0xC000_0000
        entries += workspace_snapshot_entries(ws, 8 * MiB, stream, trace_frames(7))
    b1_size = round_size(4 * MiB, npu)
    entries.append(alloc_entry(s0 + 8 * MiB, 4 * MiB, stream, t + 10, trace_frames(50), **kw))
    entries.append(snapshot_entry(8 * MiB + b1_size, t + 20, **kw))    # stream: nullptr
    small = round_size(1000, npu)
    entries.append(segment_alloc_entry(s1, SMALL_BUFFER, stream, t + 30, trace_frames(51), **kw))
    entries.append(alloc_entry(s1, 1000, stream, t + 31, trace_frames(51), **kw))
    mid = round_size(9 * MiB, npu)       # S0's 8 MiB remainder is too small: a new segment
    entries.append(segment_alloc_entry(s3, LARGE_BUFFER, stream, t + 35, trace_frames(55), **kw))
    entries.append(alloc_entry(s3, 9 * MiB, stream, t + 36, trace_frames(55), **kw))
    big = round_size(30 * MiB, npu)
    s2_size = allocation_size(big)
    entries.append(segment_alloc_entry(s2, s2_size, stream, t + 40, trace_frames(52), **kw))
    entries.append(alloc_entry(s2, 30 * MiB, stream, t + 41, trace_frames(52), **kw))
    if sh.name == "2.14":
        entries.append(annotate_entry(s2, 30 * MiB, "kept for backward", stream, t + 42,
                                      trace_frames(53), **kw))
    free_frames = trace_frames(60) if context == "all" else trace_frames(52)
    entries += free_entries(s2, 30 * MiB, stream, t + 50, free_frames, **kw)
    free_frames = trace_frames(61) if context == "all" else trace_frames(51)
    entries += free_entries(s1, 1000, stream, t + 60, free_frames, **kw)
    asked = 60 * MiB + 1
    oom_size = round_size(asked, npu)
    device_free = 41 * MiB + 3 * 4096
    oom_frames = trace_frames(70)
    # release_cached_blocks: the large pool's unsplit free segments, then the small pool's
    entries.append(segment_free_entry(s2, s2_size, stream, t + 70, oom_frames, **kw))
    entries.append(segment_free_entry(s1, SMALL_BUFFER, stream, t + 71, oom_frames, **kw))
    entries.append(oom_entry(oom_size, device_free, stream, t + 72, oom_frames, **kw))
    s0_blocks = [block(8 * MiB, frames=[]),                       # before recording began
                 block(b1_size, requested_size=4 * MiB, frames=block_frames(50)),
                 block(LARGE_BUFFER - 8 * MiB - b1_size, "inactive")]
    s3_blocks = [block(mid, requested_size=9 * MiB, frames=block_frames(55)),
                 block(LARGE_BUFFER - mid, "inactive")]
    segments = [segment(s0, s0_blocks, stream),
                segment(s3, s3_blocks, stream, frames=block_frames(55))]
    if npu:
        segments.append(segment(ws, [block(8 * MiB, frames=block_frames(7))], stream,
                                frames=block_frames(7), small=False))
    annotations = [Annotation("START", "ProfilerStep#3", t + 5),
                   Annotation("END", "ProfilerStep#3", t + 65)]
    snap = build(version, segments, entries, devices=devices, annotations=annotations, start_us=t)
    return Scenario(snap, oom_size, device_free, asked)


def plain_types(value) -> bool:
    """Only what PyTorch's snapshot holds: dict, list, tuple, str, int, float, bool, None."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain_types(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(plain_types(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))
