"""The shape of a memory snapshot, checked once when a file is read, so nothing after it meets
a wrong type: every field npumem reads has the type and range PyTorch writes, or the file is
refused with the place (`segments[3].blocks[0].size`) and the reason.

Fields npumem does not read are left alone; a field may be absent wherever PyTorch's older
snapshots leave it out, but never None where PyTorch writes a number.
"""

from __future__ import annotations

from . import columns as entry_columns
from ..file_checks import ADDRESS_LIMIT, TraceFormatError, natural, shown

MAX_DEVICES = 1024
# npumem's key for what c10 told its OOM observers (profile.torch_memory writes it): the memory
# PyTorch was allowed, which a snapshot does not otherwise hold. PyTorch's tools ignore it.
OOM_KEY = "npumem_oom"
OOM_FIELDS = ("device", "alloc_size", "allowed", "device_free", "device_total")

# Every trace entry action c10's allocator records (TraceEntry::Action), by the names
# `torch.cuda.memory._snapshot()` gives them: `annotate` since 2.14, `workspace_snapshot` from
# torch_npu (its workspace allocator's blocks); neither changes the caching allocator's state.
# Trace entries are checked by the reader that puts them in columns (_reader.c).
ACTIONS = entry_columns.ACTIONS

# Frames kept per stack: PyTorch's unwinder stops far below this; a file whose entries share a
# list of 100,000 frames would otherwise cost every reader 100,000 frames per entry.
MAX_FRAMES = entry_columns.MAX_FRAMES
NOTES_KEY = "npumem_notes"          # what reading a file changed, for the report to say


class _Checker:
    def __init__(self, path: str):
        self.path = path
        # id(frames) -> (frames, the frames kept): each list checked once; holding the list
        # keeps its id from being reused while the check runs
        self.stacks: dict[int, tuple[list, list]] = {}
        self.cut = 0                          # stacks longer than MAX_FRAMES

    def fail(self, where: str, reason: str):
        raise TraceFormatError(self.path, where, reason)

    def fields(self, item: dict, where: str, required: tuple, optional: tuple = (),
               limit: int = ADDRESS_LIMIT) -> None:
        """Integers in [0, limit): `required` must be there, `optional` may be absent."""
        for key in required + tuple(key for key in optional if key in item):
            if not natural(item.get(key), limit):
                self.fail(f"{where}.{key}", _wanted("an integer", limit, item.get(key)))

    def pool_id(self, item: dict, where: str, key: str) -> None:
        """A MempoolId_t: a pair of integers (a tuple in a pickle, a list in JSON)."""
        value = item.get(key)
        if value is None:
            return
        if not (isinstance(value, (tuple, list)) and len(value) == 2
                and all(natural(part) for part in value)):
            self.fail(f"{where}.{key}", f"must be a pair of integers in [0, 2**64) (a memory "
                      f"pool's id), got {shown(value)}")

    def text(self, item: dict, where: str, *keys: str) -> None:
        for key in keys:
            value = item.get(key)
            if value is not None and not isinstance(value, str):
                self.fail(f"{where}.{key}", f"must be a string, got {shown(value)}")

    def frames(self, item: dict, where: str) -> None:
        """Check a stack once however many items share it, and keep its innermost
        MAX_FRAMES frames."""
        frames = item.get("frames")
        if frames is None:
            return
        known = self.stacks.get(id(frames))
        if known is None:
            self._check_frames(frames, where)
            kept = frames
            if len(frames) > MAX_FRAMES:
                kept = frames[:MAX_FRAMES]
                self.cut += 1
            self.stacks[id(frames)] = (frames, kept)
        else:
            kept = known[1]
        if kept is not frames:
            item["frames"] = kept

    def _check_frames(self, frames, where: str) -> None:
        if _plain_frames(frames):
            return
        if not isinstance(frames, list):
            self.fail(f"{where}.frames", f"must be a list, got {shown(frames)}")
        for index, frame in enumerate(frames):
            if not isinstance(frame, dict):
                self.fail(f"{where}.frames[{index}]", f"must be a dict, got {shown(frame)}")
            self.text(frame, f"{where}.frames[{index}]", "filename", "name")
            line = frame.get("line")
            if line is not None and (isinstance(line, bool) or not isinstance(line, int)):
                self.fail(f"{where}.frames[{index}].line", f"must be an integer, got {shown(line)}")

    def segment(self, segment, where: str) -> None:
        if not isinstance(segment, dict):
            self.fail(where, f"a segment must be a dict, got {shown(segment)}")
        self.fields(segment, where, ("address", "total_size"),
                    ("stream", "allocated_size", "active_size", "requested_size"))
        self.fields(segment, where, (), ("device",), MAX_DEVICES)
        self.text(segment, where, "segment_type")
        self.pool_id(segment, where, "segment_pool_id")
        self.frames(segment, where)
        blocks = segment.get("blocks")
        if not isinstance(blocks, list):
            self.fail(f"{where}.blocks", f"must be a list, got {shown(blocks)}")
        for index, block in enumerate(blocks):
            at = f"{where}.blocks[{index}]"
            if not isinstance(block, dict):
                self.fail(at, f"a block must be a dict, got {shown(block)}")
            self.fields(block, at, ("address", "size"), ("requested_size",))
            if not isinstance(block.get("state"), str):
                self.fail(f"{at}.state", f"must be a string, got {shown(block.get('state'))}")
            start, end = segment["address"], segment["address"] + segment["total_size"]
            if not start <= block["address"] <= block["address"] + block["size"] <= end:
                self.fail(at, f"the block [{block['address']:#x}, +{block['size']}) lies outside "
                          f"its segment [{start:#x}, {end:#x})")
            self.frames(block, at)

    def tables(self, tables: entry_columns.Tables) -> None:
        """The stacks and extra fields the entries share, checked again as the reader left them:
        a hostile pickle can change a frame after the entry that used it was checked."""
        for index, frames in enumerate(tables.stacks):
            self._check_frames(frames, f"device_traces: stack {index}")
        for extra in tables.extra_dicts:
            self.fields(extra, "device_traces: an entry", (), ("device_free",))
            self.pool_id(extra, "device_traces: an entry", "pool_id")


def _plain_frames(frames) -> bool:
    """The common case, fast (a snapshot has a million frames): a list of complete frames."""
    if type(frames) is not list:
        return False
    try:
        return all(type(frame["filename"]) is str and type(frame["name"]) is str
                   and type(frame["line"]) is int for frame in frames)
    except (KeyError, TypeError):
        return False


def _wanted(what: str, limit: int, value) -> str:
    bound = "2**64" if limit == ADDRESS_LIMIT else str(limit)
    return f"must be {what} in [0, {bound}), got {shown(value)}"


def check_snapshot(data, path: str) -> dict:
    """`data` when it has a snapshot's shape; TraceFormatError naming the first wrong field."""
    checker = _Checker(path)
    if not isinstance(data, dict):
        checker.fail("0", "not a memory snapshot (a dict with 'segments' and 'device_traces', "
                     f"as torch.cuda.memory._snapshot() returns); it holds a {type(data).__name__}")
    if "segments" not in data and "device_traces" not in data:
        keys = ", ".join(shown(key) for key in list(data)[:5]) or "none"
        checker.fail("0", "not a memory snapshot: a dict with neither 'segments' nor "
                     "'device_traces' (as torch.cuda.memory._snapshot() returns); its keys: "
                     + keys + ("..." if len(data) > 5 else ""))
    segments = data.get("segments", [])
    traces = data.get("device_traces", [])
    if not isinstance(segments, list):
        checker.fail("segments", f"must be a list, got {shown(segments)}")
    if not isinstance(traces, list) or len(traces) > MAX_DEVICES:
        checker.fail("device_traces", f"must be a list of at most {MAX_DEVICES} device traces")
    settings = data.get("allocator_settings")
    if settings is not None and not isinstance(settings, dict):
        checker.fail("allocator_settings", f"must be a dict, got {shown(settings)}")
    limits = data.get(OOM_KEY)
    if limits is not None:
        if not isinstance(limits, dict):
            checker.fail(OOM_KEY, f"must be a dict, got {shown(limits)}")
        checker.fields(limits, OOM_KEY, OOM_FIELDS)
    for index, segment in enumerate(segments):
        checker.segment(segment, f"segments[{index}]")
    lists = [trace for trace in traces if not isinstance(trace, entry_columns.Entries)]
    if lists:
        for device, trace in enumerate(traces):
            if not isinstance(trace, (list, entry_columns.Entries)):
                checker.fail(f"device_traces[{device}]", f"must be a list, got {shown(trace)}")
        try:
            columns, _ = entry_columns.from_entry_lists(
                [list(trace) for trace in traces], shown)
        except entry_columns.EntryError as exc:
            checker.fail(exc.where, exc.reason)
        data["device_traces"] = traces = columns
    if traces:
        tables = traces[0].columns.tables
        checker.tables(tables)
        checker.cut += tables.cut
    if checker.cut:
        data.setdefault(NOTES_KEY, []).append(
            f"{checker.cut} stack(s) had more than {MAX_FRAMES} frames: the innermost "
            f"{MAX_FRAMES} are kept")
    return data


def oom_device_free(entry: dict) -> int:
    """The free device bytes an `oom` entry reports (PyTorch: `device_free`; older npumem and
    hand-made files: `addr`)."""
    return entry.get("device_free", entry.get("addr", 0)) or 0
