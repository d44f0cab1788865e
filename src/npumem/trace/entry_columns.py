"""A device's trace entries held as columns: about 50 bytes an entry instead of a dict's 500.

`_snapshot_reader` (C) fills the columns while it unpickles a snapshot, checking each entry
against the rule PyTorch's writer keeps (the one statement of that rule); lists of entry dicts
(JSON snapshots, snapshots built in memory) go through the same C code. `Entries` is a sequence:
an item is the entry's dict, made when asked for, so code written for lists of dicts works
unchanged, while code that walks millions of entries reads the numpy columns directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import _snapshot_reader as native

ACTIONS: tuple[str, ...] = native.ACTIONS
ACTION_CODE = {name: code for code, name in enumerate(ACTIONS)}
MAX_FRAMES = native.MAX_FRAMES
_CHUNK = 1 << 16            # entries turned into dicts at a time while iterating


class Tables:
    """What the rows of one file share: interned stacks and extra fields."""

    def __init__(self, stacks: list, extras: list, cut: int):
        self.stacks, self.extras, self.cut = stacks, extras, cut
        self.extra_dicts = [dict(zip(items[::2], items[1::2])) for items in extras]


class Columns:
    """One device's rows (numpy views of the reader's bytearrays)."""

    def __init__(self, raw: dict, tables: Tables):
        self.tables = tables
        self.action = np.frombuffer(raw["action"], np.uint8)
        self.flags = np.frombuffer(raw["flags"], np.uint8)
        self.addr = np.frombuffer(raw["addr"], np.uint64)
        self.size = np.frombuffer(raw["size"], np.uint64)
        self.stream = np.frombuffer(raw["stream"], np.uint64)
        self.time_raw = np.frombuffer(raw["time"], np.int64)
        self.requested = np.frombuffer(raw["requested"], np.uint64)
        self.stack = np.frombuffer(raw["stack"], np.uint32)
        self.extra = np.frombuffer(raw["extra"], np.uint32)

    def times(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """time_us as float64 (0 where absent), as the readers treat it."""
        raw = self.time_raw[start:stop]
        flags = self.flags[start:stop]
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
        return next(self._dicts(self.start + index, self.start + index + 1))

    def __iter__(self):
        for start in range(self.start, self.stop, _CHUNK):
            yield from self._dicts(start, min(start + _CHUNK, self.stop))

    def __eq__(self, other) -> bool:
        if isinstance(other, (Entries, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __add__(self, other):
        return list(self) + list(other)

    def __radd__(self, other):
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"<{len(self):,} trace entries>"

    def _dicts(self, start: int, stop: int):
        c = self.columns
        tables = c.tables
        stacks, extras = tables.stacks, tables.extra_dicts
        times = c.time_raw[start:stop]
        rows = zip(c.action[start:stop].tolist(), c.flags[start:stop].tolist(),
                   c.addr[start:stop].tolist(), c.size[start:stop].tolist(),
                   c.stream[start:stop].tolist(), times.tolist(),
                   times.view(np.float64).tolist(), c.requested[start:stop].tolist(),
                   c.stack[start:stop].tolist(), c.extra[start:stop].tolist())
        for action, flags, addr, size, stream, when, when_float, requested, stack, extra in rows:
            entry = {"action": ACTIONS[action]}
            if flags & 1:
                entry["addr"] = addr
            entry["size"] = size
            if flags & 4:
                entry["stream"] = stream
            if flags & 8:
                entry["time_us"] = when_float if flags & 16 else when
            if extra:
                entry.update(extras[extra])
            if flags & 32:
                entry["requested_size"] = requested
            if flags & 64:
                entry["frames"] = stacks[stack]
            yield entry


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
    try:
        raw, stacks, extras, cut = native.from_entries(traces)
    except native.EntryError as exc:
        raise _entry_error(exc, shown) from None
    tables = Tables(stacks, extras, cut)
    return [Entries(Columns(columns, tables)) for columns in raw], tables


def load_pickle(data: bytes, shown) -> tuple[object, list[Entries], Tables]:
    """(the snapshot's other data, each device's entries, their tables); UnsafePickle for a
    pickle that is not plain data or is damaged, EntryError for an entry that breaks the rule."""
    try:
        root, (raw, stacks, extras, cut) = native.load(data)
    except native.EntryError as exc:
        raise _entry_error(exc, shown) from None
    tables = Tables(stacks, extras, cut)
    return root, [Entries(Columns(columns, tables)) for columns in raw], tables


UnsafePickle = native.UnsafePickle


def columns_of(entries) -> Entries:
    """`entries` as Entries (a list of dicts is read into columns first)."""
    if isinstance(entries, Entries):
        return entries
    from .events import shown
    return from_entry_lists([list(entries)], shown)[0][0]
