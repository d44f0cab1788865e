"""A device's trace entries held as columns: about 50 bytes an entry instead of a dict's 500.

`_reader` (C) fills the columns while it unpickles a snapshot, checking each entry
against the rule PyTorch's writer keeps (the one statement of that rule); lists of entry dicts
(JSON snapshots, snapshots built in memory) go through the same C code. `Entries` is a sequence:
an item is the entry's dict, made when asked for, so code written for lists of dicts works
unchanged, while code that walks millions of entries reads the numpy columns directly.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator, Sequence

import numpy as np

from ...events import TraceEvent
from ...units import format_size

try:
    from . import _reader as native
except ImportError:           # a checkout not installed with `pip install -e .`: all but
    native = None             # reading a snapshot pickle still works

NOT_BUILT = ("npumem's snapshot reader (a C extension) is not built here: install npumem with "
             "`pip install -e .` in its checkout (it needs a C compiler)")

# Every trace entry action c10's allocator records (TraceEntry::Action), by the names
# `torch.cuda.memory._snapshot()` gives them, in the reader's code order (checked against it).
ACTIONS: tuple[str, ...] = native.ACTIONS if native else (
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
    "segment_unmap", "oom", "snapshot", "annotate", "workspace_snapshot")
ACTION_CODE = {name: code for code, name in enumerate(ACTIONS)}
ALLOC, FREE_REQUESTED, FREE_COMPLETED = (ACTION_CODE[name] for name in (
    "alloc", "free_requested", "free_completed"))          # the codes walks compare with
MAX_FRAMES = 256
SEGMENT_ADD = ("segment_alloc", "segment_map")        # actions that reserve device memory
SEGMENT_REMOVE = ("segment_free", "segment_unmap")    # and that give it back
_CHUNK = 1 << 16            # entries turned into dicts at a time while iterating


class Tables:
    """What the rows of one file share: interned stacks and extra fields."""

    def __init__(self, stacks: list, extras: list, cut: int):
        self.stacks, self.cut = stacks, cut
        self.extra_dicts = [dict(zip(items[::2], items[1::2])) for items in extras]
        self.action_names = None            # object arrays for `rows`, made on first use

    def prepare(self) -> None:
        self.action_names = np.array(ACTIONS, dtype=object)
        self.stack_objects = np.empty(len(self.stacks) + 1, dtype=object)
        self.stack_objects[:len(self.stacks)] = self.stacks    # the last: no frames (None)
        self.extra_objects = np.empty(len(self.extra_dicts), dtype=object)
        self.extra_objects[:] = self.extra_dicts


class Columns:
    """One device's rows (numpy views of the reader's bytearrays)."""

    def __init__(self, raw: dict, tables: Tables):
        self.tables = tables
        self.flags = np.frombuffer(raw["flags"], np.uint8)     # (never all zeros: HAS_SIZE)
        rows = len(self.flags)

        def column(name: str, dtype) -> np.ndarray:
            """The reader gives None for a column of zeros: np.zeros takes no memory until
            written (its pages are the kernel's zero page)."""
            data = raw[name]
            return np.zeros(rows, dtype) if data is None else np.frombuffer(data, dtype)

        self.action = column("action", np.uint8)
        self.addr = column("addr", np.uint64)
        self.size = column("size", np.uint64)
        self.stream = column("stream", np.uint64)
        self.time_raw = column("time", np.int64)
        self.requested = column("requested", np.uint64)
        self.stack = column("stack", np.uint32)
        self.extra = column("extra", np.uint32)

    def times(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """time_us as float64 (0 where absent), as the readers treat it: a view of the column
        where every time is a float (JSONL's), a new array otherwise."""
        raw = self.time_raw[start:stop]
        flags = self.flags[start:stop]
        both = native.HAS_TIME | native.TIME_FLOAT
        if np.all(flags & both == both):
            return raw.view(np.float64)
        out = raw.astype(np.float64)
        floats = (flags & native.TIME_FLOAT) != 0
        if floats.any():
            out[floats] = raw[floats].view(np.float64)
        out[(flags & native.HAS_TIME) == 0] = 0.0
        return out


class Entries(Sequence):
    """Rows start..stop of one device's columns, as a sequence of entry dicts."""

    def __init__(self, columns: Columns, start: int = 0, stop: int | None = None):
        self.columns = columns
        self.start = start
        self.stop = len(columns.action) if stop is None else stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return Entries(self.columns, self.start + start, self.start + max(start, stop))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("trace entry index out of range")
        return next(self._dicts(slice(self.start + index, self.start + index + 1)))

    def __iter__(self):
        for start in range(self.start, self.stop, _CHUNK):
            yield from self._dicts(slice(start, min(start + _CHUNK, self.stop)))

    def __eq__(self, other) -> bool:
        if isinstance(other, (Entries, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __radd__(self, other):
        return list(other) + list(self)          # list + entries (a few, where code joins them)

    def __repr__(self) -> str:
        return f"<{len(self):,} trace entries>"

    def rows(self, reverse: bool = False):
        """`rows(self)`, by chunks of columns."""
        c = self.columns
        tables = c.tables
        if tables.action_names is None:
            tables.prepare()
        bounds = [(start, min(start + _CHUNK, self.stop))
                  for start in range(self.start, self.stop, _CHUNK)]
        for start, stop in reversed(bounds) if reverse else bounds:
            flags = c.flags[start:stop]
            stack = np.where(flags & native.HAS_FRAMES, c.stack[start:stop], len(tables.stacks))
            chunk = zip(tables.action_names[c.action[start:stop]].tolist(),
                        c.addr[start:stop].tolist(), c.size[start:stop].tolist(),
                        c.stream[start:stop].tolist(), c.times(start, stop).tolist(),
                        tables.stack_objects[stack].tolist(),
                        tables.extra_objects[c.extra[start:stop]].tolist(),
                        c.requested[start:stop].tolist())
            if reverse:
                yield from reversed(list(chunk))
            else:
                yield from chunk

    def take(self, positions) -> list[dict]:
        """The entries at these positions (in this view), as dicts."""
        return list(self._dicts(np.asarray(positions, dtype=np.int64) + self.start))

    def indices(self, *actions: str) -> np.ndarray:
        """Positions (in this view) of the entries with one of these actions."""
        codes = [ACTION_CODE[a] for a in actions]
        return np.flatnonzero(np.isin(self.columns.action[self.start:self.stop], codes))

    def _dicts(self, at):
        """Dicts of the rows at `at` (a slice or an array of row numbers)."""
        c = self.columns
        tables = c.tables
        stacks, extras = tables.stacks, tables.extra_dicts
        times = c.time_raw[at]
        rows = zip(c.action[at].tolist(), c.flags[at].tolist(), c.addr[at].tolist(),
                   c.size[at].tolist(), c.stream[at].tolist(), times.tolist(),
                   times.view(np.float64).tolist(), c.requested[at].tolist(),
                   c.stack[at].tolist(), c.extra[at].tolist())
        for action, flags, addr, size, stream, when, when_float, requested, stack, extra in rows:
            entry = {"action": ACTIONS[action]}
            if flags & native.HAS_ADDR:
                entry["addr"] = addr
            entry["size"] = size
            if flags & native.HAS_STREAM:
                entry["stream"] = stream
            if flags & native.HAS_TIME:
                entry["time_us"] = when_float if flags & native.TIME_FLOAT else when
            if extra:
                entry.update(extras[extra])
            if flags & native.HAS_REQUESTED:
                entry["requested_size"] = requested
            if flags & native.HAS_FRAMES:
                entry["frames"] = stacks[stack]
            yield entry


UnsafePickle = native.UnsafePickle if native else type("UnsafePickle", (ValueError,), {})


class EntryError(ValueError):
    """An entry breaks the rule: `where` (device_traces[d][i].field) and the reason."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


def _entry_error(exc: Exception, shown) -> EntryError:
    where, reason, value = exc.args
    return EntryError(where, reason.replace("{}", shown(value)))


def from_entry_lists(traces: list, shown) -> tuple[list[Entries], Tables]:
    """Entries of lists of entry dicts, one per device; EntryError at the first wrong field."""
    return _read_entries("from_entries", traces, shown)


def from_entry_stream(pairs, shown) -> list[Entries]:
    """As from_entry_lists, of (device, entry dict) pairs an iterator gives, one at a time."""
    return _read_entries("from_entry_stream", pairs, shown)[0]


def _read_entries(reader: str, source, shown) -> tuple[list[Entries], Tables]:
    if native is None:
        raise EntryError("device_traces", NOT_BUILT)
    try:
        raw, stacks, extras, cut = getattr(native, reader)(source)
    except native.EntryError as exc:
        raise _entry_error(exc, shown) from None
    tables = Tables(stacks, extras, cut)
    return [Entries(Columns(columns, tables)) for columns in raw], tables


def load_pickle(data, shown) -> tuple[object, list[Entries], Tables]:
    """(the snapshot's other data, each device's entries, their tables) of a pickle's bytes, or
    of a binary file read a window at a time (textio.bounded_reader); UnsafePickle for a
    pickle that is not plain data or is damaged, EntryError for an entry that breaks the rule."""
    if native is None:
        raise UnsafePickle(NOT_BUILT)
    collecting = gc.isenabled()
    gc.disable()                # the reader makes and drops a list per entry: no cycles to find
    try:
        root, (raw, stacks, extras, cut) = native.load(data)
    except native.EntryError as exc:
        raise _entry_error(exc, shown) from None
    finally:
        if collecting:
            gc.enable()
    tables = Tables(stacks, extras, cut)
    return root, [Entries(Columns(columns, tables)) for columns in raw], tables




def from_events(events) -> "Entries | list[dict]":
    """A trace of TraceEvents (an alloc, or the free that makes its block reusable) as the
    entries of a snapshot's trace: columns, not a dict per event. Numbers past 64 bits stay
    dicts, as do all of them where the reader (the C extension that defines the columns'
    flags) is not built."""
    action, addr, size, stream, times = [], [], [], [], []
    for event in events:
        action.append(ALLOC if event.action == "alloc" else FREE_COMPLETED)
        addr.append(event.addr)
        size.append(event.size)
        stream.append(event.stream)
        times.append(event.t_us)
    if native is None:
        return _entry_dicts(action, addr, size, stream, times)
    try:
        floats = np.array([type(t) is float for t in times], dtype=bool)
        raw = np.where(floats, np.array(times, dtype=np.float64).view(np.int64),
                       np.array([0 if f else t for f, t in zip(floats.tolist(), times)],
                                dtype=np.int64))
        columns = {"rows": len(action), "action": np.array(action, np.uint8),
                   "addr": np.array(addr, np.uint64),
                   "size": np.array(size, np.uint64), "stream": np.array(stream, np.uint64),
                   "time": raw}
    except (OverflowError, ValueError, TypeError):
        return _entry_dicts(action, addr, size, stream, times)
    return from_event_columns(columns, floats)


def from_event_columns(raw: dict | None, floats: np.ndarray | bool = True) -> "Entries":
    """Events as columns ("rows": their number; action codes, addr, size, stream and the time's
    bits as int64, a column None where all zeros; `raw` None: no events) as a snapshot trace's
    entries; `floats` says which times are floats' bits (the others are ints)."""
    if raw is None:
        raw = {"rows": 0, "action": b"", "addr": b"", "size": b"", "stream": b"", "time": b""}
    rows = raw["rows"]
    flags = np.full(rows, native.HAS_ADDR | native.HAS_SIZE | native.HAS_STREAM
                    | native.HAS_TIME, dtype=np.uint8) | (np.asarray(floats, bool)
                                                          * native.TIME_FLOAT).astype(np.uint8)
    return Entries(Columns({**raw, "flags": flags, "requested": None, "stack": None,
                            "extra": None}, Tables([], [()], 0)))


def to_events(entries) -> Iterator[TraceEvent]:
    """The allocs and frees (free_completed) of `from_events`' entries as TraceEvents again, a
    chunk of columns at a time."""
    if not isinstance(entries, Entries):
        for e in entries:
            yield TraceEvent(e["time_us"], "alloc" if e["action"] == "alloc" else "free",
                             e["addr"], e["size"], e["stream"])
        return
    c = entries.columns
    for start in range(entries.start, entries.stop, _CHUNK):
        at = slice(start, min(start + _CHUNK, entries.stop))
        for code, t_us, addr, size, on in zip(c.action[at].tolist(), c.times(at.start, at.stop)
                                              .tolist(), c.addr[at].tolist(),
                                              c.size[at].tolist(), c.stream[at].tolist()):
            yield TraceEvent(t_us, "alloc" if code == ALLOC else "free", addr, size, on)


def _entry_dicts(action, addr, size, stream, times) -> list[dict]:
    return [{"action": ACTIONS[a], "addr": at, "size": n, "stream": on, "time_us": t}
            for a, at, n, on, t in zip(action, addr, size, stream, times)]


def rows(entries, reverse: bool = False):
    """(action, addr, size, stream, time_us, frames, extra, requested) of each entry, in order
    (or backwards): what a walk over millions of entries reads, without a dict per entry.
    `extra` answers .get() for the other fields (pool_id, category, user_metadata); absent
    numbers are 0, absent frames None, time_us a float, requested the requested_size."""
    if isinstance(entries, Entries):
        return entries.rows(reverse)
    return ((e["action"], e.get("addr", 0) or 0, e.get("size", 0) or 0,
             int(e.get("stream") or 0), float(e.get("time_us", 0) or 0), e.get("frames"), e,
             e.get("requested_size") or 0)
            for e in (reversed(entries) if reverse else entries))


def take(entries, positions) -> list[dict]:
    """The entries at these positions, as dicts."""
    if isinstance(entries, Entries):
        return entries.take(positions)
    return [entries[p] for p in positions]


def indices(entries, *actions: str) -> list[int]:
    """Positions of the entries with one of these actions."""
    if isinstance(entries, Entries):
        return entries.indices(*actions).tolist()
    return [i for i, e in enumerate(entries) if isinstance(e, dict) and e.get("action") in actions]


def holds(entries, *actions: str) -> bool:
    """Whether any entry has one of these actions (no list of positions made to say so)."""
    if isinstance(entries, Entries):
        return bool(having(entries.columns.action[entries.start:entries.stop], *actions).any())
    return any(isinstance(e, dict) and e.get("action") in actions for e in entries)


def highest_address(entries) -> int:
    """The highest address any entry names (0 for none)."""
    if isinstance(entries, Entries):
        addr = entries.columns.addr[entries.start:entries.stop]
        return int(addr.max()) if len(addr) else 0
    return max((e.get("addr", 0) or 0 for e in entries), default=0)


# --- a trace as numpy arrays: what walks over millions of entries compute with ----------------

UNKNOWN_ACTION = 255        # the code of an action outside ACTIONS (entries held in a list)
_BLOCK_ACTIONS = ("alloc", "free_requested", "free_completed")


class Arrays:
    """A device trace as numpy arrays, one element per entry, whatever holds it (`arrays`): the
    action's code (ACTION_CODE), addr, size, stream and requested (the requested_size) as
    `rows` gives them (absent: 0), time_us as a float (absent: 0.0); `stacks[stack]` is the
    entry's frames (None for none) and `extras[extra]` answers .get for its other fields.
    `cache` holds what several walks over the trace share."""

    def __init__(self, action, addr, size, stream, requested, time, stack, stacks, extra,
                 extras):
        self.action, self.addr, self.size, self.stream = action, addr, size, stream
        self.requested, self._time = requested, time
        self._stack, self.stacks, self.extra, self.extras = stack, stacks, extra, extras
        self.cache: dict = {}

    @property
    def time(self) -> np.ndarray:
        """Made when first read where `time` was given as what makes it (a replay reads none:
        80 MB at ten million entries)."""
        if callable(self._time):
            self._time = self._time()
        return self._time

    @property
    def stack(self) -> np.ndarray:
        """As `time` (a replay reads a few: 40 MB at ten million entries with frames)."""
        if callable(self._stack):
            self._stack = self._stack()
        return self._stack

    def stack_at(self, rows: np.ndarray) -> np.ndarray:
        """stack[rows], without making the whole column where it is not made yet."""
        return self._stack(rows) if callable(self._stack) else self._stack[rows]

    def __len__(self) -> int:
        return len(self.action)


_ARRAYS = weakref.WeakKeyDictionary()       # Columns -> {(start, stop): Arrays}


def arrays(entries) -> Arrays:
    """`entries` (Entries, or a list of entry dicts) as Arrays; made once per view of a file's
    columns (the rows of a list are read again at each call)."""
    if isinstance(entries, Arrays):
        return entries
    if not isinstance(entries, Entries):
        return _arrays_of_rows(entries)
    known = _ARRAYS.setdefault(entries.columns, {})
    key = (entries.start, entries.stop)
    if key not in known:
        c, start, stop = entries.columns, entries.start, entries.stop
        tables = c.tables
        def stack(rows=slice(None)) -> np.ndarray:
            framed = c.flags[start:stop][rows] & native.HAS_FRAMES
            none = np.uint32(len(tables.stacks))          # the index of "no frames"
            return np.where(framed, c.stack[start:stop][rows], none) if framed.any() else \
                np.broadcast_to(none, (len(framed),))     # (no entry has frames: no bytes)
        known[key] = Arrays(c.action[start:stop], c.addr[start:stop], c.size[start:stop],
                            c.stream[start:stop], c.requested[start:stop],
                            lambda: c.times(start, stop), stack, [*tables.stacks, None],
                            c.extra[start:stop], tables.extra_dicts)
    return known[key]


def natural(values) -> np.ndarray:
    """Python numbers as uint64, where they all are integers in [0, 2**64); else as Python
    objects, so that sums stay exact."""
    array = np.array(values)
    if not len(array):
        return np.zeros(0, np.uint64)
    if array.dtype.kind == "u" or (array.dtype.kind == "i" and array.min() >= 0):
        return array.astype(np.uint64)
    return np.array(values, dtype=object)


def exact(values: np.ndarray) -> np.ndarray:
    """Unsigned sizes as int64 where no sum of them can overflow it, else as Python ints."""
    if values.dtype == object:
        return values
    if not len(values) or int(values.max()) < (1 << 63) // len(values):
        return values.astype(np.int64)
    return values.astype(object)


def _arrays_of_rows(entries) -> Arrays:
    action, addr, size, stream, time, stack, requested = [], [], [], [], [], [], []
    stacks: list = []
    stack_of: dict[int, int] = {}            # id(frames) -> its index: a shared list is one stack
    for name, at, nbytes, on, when, frames, _, asked in rows(entries):
        action.append(ACTION_CODE.get(name, UNKNOWN_ACTION))
        addr.append(at)
        size.append(nbytes)
        stream.append(on)
        time.append(when)
        requested.append(asked)
        index = stack_of.get(id(frames))
        if index is None:
            index = stack_of[id(frames)] = len(stacks)
            stacks.append(frames)
        stack.append(index)
    extras = entries if isinstance(entries, list) else list(entries)
    return Arrays(np.array(action, dtype=np.uint8), natural(addr), natural(size), natural(stream),
                  natural(requested), np.array(time, dtype=np.float64),
                  np.array(stack, dtype=np.intp), stacks, np.arange(len(extras)), extras)


def having(codes: np.ndarray, *actions: str) -> np.ndarray:
    """Where the action codes are those of these actions (a mask; one lookup per entry)."""
    table = np.zeros(256, dtype=bool)
    table[[ACTION_CODE[action] for action in actions]] = True
    return table[codes]


def block_order(a: Arrays, actions: tuple[str, ...] = _BLOCK_ACTIONS, stop: int | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each block's story, for walks that follow blocks: the positions of the entries before
    `stop` with one of these actions (alloc and the frees), sorted by address and then
    position; True where one is the first of its address; their action codes and addresses.
    The sort is made once per trace and kept (4 bytes an entry), and so are the codes and
    addresses in its order (9 more)."""
    order = a.cache.get("block_order")
    if order is None:
        positions = positions_where(having(a.action, *_BLOCK_ACTIONS))
        order = a.cache["block_order"] = stable_order(a.addr, positions)
        del positions
    gathered = a.cache.get("block_order_gathered")
    if gathered is None:
        gathered = a.cache["block_order_gathered"] = a.action[order], a.addr[order]
    codes, addr = gathered
    keep = None
    if set(actions) != set(_BLOCK_ACTIONS):
        keep = having(codes, *actions)
    if stop is not None and stop < len(a):
        keep = order < stop if keep is None else keep & (order < stop)
    positions = order if keep is None else order[keep]
    if keep is not None:
        codes, addr = codes[keep], addr[keep]
    first = np.empty(len(positions), dtype=bool)
    first[:1] = True
    first[1:] = addr[1:] != addr[:-1]
    return positions, first, codes, addr


DEVICE_BYTES_LIMIT = 1 << 48     # more than any device holds
_GRANTED = {"alloc": "an allocation", "segment_alloc": "a segment", "segment_map": "a mapping"}


def impossible_grant(entries) -> tuple[int, str] | None:
    """The first allocation, segment or mapping that succeeded with more bytes than any device
    holds, as (entry index, what it was), or None: such an entry cannot be real (the file was
    damaged or made up). Refused requests (oom entries) may ask for anything."""
    a = arrays(entries)
    chunk = 1 << 18
    for begin in range(0, len(a), chunk):               # (bounded temporaries)
        granted = begin + np.flatnonzero(having(a.action[begin:begin + chunk], *_GRANTED))
        too_large = granted[a.size[granted] > DEVICE_BYTES_LIMIT]
        if len(too_large):
            index = int(too_large[0])
            size = int(a.size[index])
            return index, (f"{_GRANTED[ACTIONS[a.action[index]]]} of {format_size(size)} "
                           f"({size} bytes) succeeded: more than any device holds (2**48 bytes, "
                           f"256 TiB, at most), so the recording is damaged")
    return None


_RANGED = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap")


def impossible_range(entries) -> tuple[int, str] | None:
    """The first block or segment entry whose range runs past the 64-bit address space, as
    (entry index, what is wrong), or None. Such a range has no place in the allocator model:
    rebuilt into the state at the first entry, it overlaps whatever lies at low addresses once
    its end wraps, and puts two blocks at one address (issue 64). (Sizes no device holds are
    impossible_grant's: the report shows those as written.)"""
    a = arrays(entries)
    if a.addr.dtype == object or a.size.dtype == object:     # (numbers past 64 bits)
        for index, entry in enumerate(entries):
            addr, size = entry.get("addr", 0), entry.get("size", 0)
            if entry.get("action") in _RANGED and addr + size > 2**64:
                return index, _past_the_end(entry["action"], addr, size)
        return None
    chunk = 1 << 18
    for begin in range(0, len(a), chunk):               # (bounded temporaries)
        ranged = begin + np.flatnonzero(having(a.action[begin:begin + chunk], *_RANGED))
        # addr + size > 2**64, without the sum: size > 2**64 - 1 - addr
        bad = a.size[ranged] > ~a.addr[ranged]
        if bad.any():
            index = int(ranged[np.argmax(bad)])
            return index, _past_the_end(ACTIONS[a.action[index]], int(a.addr[index]),
                                        int(a.size[index]))
    return None


def _past_the_end(action: str, addr: int, size: int) -> str:
    return (f"{'an' if action[0] in 'aeiou' else 'a'} {action} of {size} bytes at 0x{addr:x} "
            f"runs past the end of the 64-bit address space (to 0x{addr + size:x}), so the "
            "recording is damaged")


def positions_where(mask: np.ndarray) -> np.ndarray:
    """np.flatnonzero(mask) as `index_type` (int32 for a trace under 2**31 entries), made a
    million at a time: no int64 array of them all on the way."""
    out = np.empty(int(np.count_nonzero(mask)), dtype=index_type(len(mask)))
    filled = 0
    for start in range(0, len(mask), 1 << 20):
        found = np.flatnonzero(mask[start:start + (1 << 20)])
        found += start
        out[filled:filled + len(found)] = found
        filled += len(found)
    return out


def stable_order(keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`rows` (int32 or int64) sorted by their keys, ties in row order: rows[np.argsort(
    keys[rows], kind="stable")], in one pass and with no gathered copy of the keys where
    uint64 keys repeat (a trace's addresses: a few thousand among millions of entries)."""
    if native is not None and keys.dtype == np.uint64 and rows.dtype in (np.int32, np.int64):
        rows = np.ascontiguousarray(rows)
        order = native.order_by_key(np.ascontiguousarray(keys), rows, rows.itemsize)
        if order is not None:
            return np.frombuffer(order, dtype=rows.dtype)
    return rows[np.argsort(keys[rows], kind="stable")]


def index_type(length: int):
    """The integer type of positions in `length` entries (int32 where it holds them: half
    the memory of int64 for the arrays of positions kept while a report is made)."""
    return np.int32 if length < 1 << 31 else np.int64


def sizes(a: Arrays) -> np.ndarray:
    """The entries' sizes as `exact` makes them, once per trace."""
    known = a.cache.get("sizes")
    if known is None:
        known = a.cache["sizes"] = exact(a.size)
    return known


def levels(start, changes, at: np.ndarray, length: int) -> np.ndarray:
    """For each of `length` entries, `start` plus the `changes` made at the sorted positions
    `at` up to and including it: a running total that moves at few entries."""
    steps = np.diff(np.r_[0, np.clip(at, 0, length), length])
    # a total past int64 (a damaged file's sizes; no device holds 2**63 bytes) is counted in
    # floats, approximately, rather than overflowing
    reach = abs(int(start)) + float(np.abs(changes.astype(np.float64)).sum())
    if changes.dtype == object or reach >= 2.0**62:
        changes = changes.astype(np.float64)
        start = float(start)
    return np.repeat(np.r_[np.array([start], dtype=changes.dtype), start + np.cumsum(changes)],
                     steps)
