"""One reading of a trace of allocations and frees whose story of an address has a hole.

A trace without a snapshot's segments (JSONL, a profiler's Chrome trace, RMM, msprof) should
tell each address's story as alloc, free, alloc, free... Real ones sometimes do not: a profiler
started mid-run, dropped an event, or wrote a free with another size. Every command that reads
such a trace (replay through any allocator, report, plan, convert) reads it as this module
mends it, and says what it changed:

- a free of an address the trace has not named before frees a block allocated before the trace
  began: the block is live from the trace's start (as PyTorch's memory viewer reads it), made
  by an alloc put before the first event with the free's size and stream;
- a free of an address whose block is freed already is a double free, and is dropped;
- an alloc at an address whose block is live means the trace missed that block's free: a free
  of it is put just before the alloc;
- a free that names another size than its block's frees the block, with the block's size (a
  free of 0 B is one whose format does not say, and is not noted).

The holes are found in one pass of C (`_reader.story_holes`, with a hash of the addresses
seen); the mended columns are made with numpy, and only where there is a hole: a whole trace
is not copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .snapshot.columns import ALLOC, FREE_COMPLETED, Entries, from_event_columns, native


@dataclass
class Mended:
    entries: object                    # Entries, or the list of dicts given (not mended)
    notes: list[str]                   # what was changed, one line each kind
    offsets: np.ndarray | None = None  # each old position's new one (and the length), if moved

    def position(self, old: int) -> int:
        """Where the event at `old` is now (for a step mark before it: still before it, and
        before what was put in front of it)."""
        return old if self.offsets is None else int(self.offsets[old])


def mend(entries, lines_for_addresses: bool = False) -> Mended:
    """`entries`: the alloc (ALLOC) and free (FREE_COMPLETED) rows of a segmentless trace, in
    order, as columns (`columns.from_events`); a list of dicts (numbers past 64 bits) is
    returned as it is. `lines_for_addresses`: the format has no addresses and its reader
    numbers each buffer by its line (msprof), which the notes then name."""
    if not isinstance(entries, Entries) or not len(entries):
        return Mended(entries, [])
    c = entries.columns
    span = slice(entries.start, entries.stop)
    addr, size = c.addr[span], c.size[span]
    *found, _ = native.story_holes(np.ascontiguousarray(c.action[span]),
                                   np.ascontiguousarray(addr), np.ascontiguousarray(size), ALLOC)
    (before_trace, double_free, missed_at, missed_block, freed_at,
     freed_block) = (np.frombuffer(positions, dtype=np.int64) for positions in found)
    if not any(len(positions) for positions in found):
        return Mended(entries, [])
    said = size[freed_at] != 0            # (a free of 0 B: a format that does not say)
    notes = _notes(addr, size, before_trace, double_free, missed_at, missed_block,
                   freed_at[said], freed_block[said], _line if lines_for_addresses else _block)
    mended, offsets = _rebuilt(c, span, before_trace, double_free, missed_at, missed_block,
                               freed_at, freed_block)
    return Mended(mended, notes, offsets)


def whole(parts) -> bool:
    """Whether a trace given as parts (columns of `columns.from_event_columns`, in order) tells
    every address's story whole: what a replay that streams the trace asks before it does."""
    stories, offset = None, 0
    for raw in parts:
        c = from_event_columns(raw).columns
        *found, stories = native.story_holes(c.action, c.addr, c.size, ALLOC, stories, offset)
        if any(found):
            return False
        offset += raw["rows"]
    return True


def _rebuilt(c, span, before_trace, double_free, missed_at, missed_block, freed_at,
             freed_block) -> tuple[Entries, np.ndarray]:
    """New columns: the allocs of blocks from before the trace first, a free put before each
    alloc that missed one, double frees out, frees with their block's size."""
    rows = span.stop - span.start
    times = c.time_raw[span]
    floats = (c.flags[span] & native.TIME_FLOAT) != 0
    columns = {"action": c.action[span], "addr": c.addr[span], "size": c.size[span].copy(),
               "stream": c.stream[span], "time": times}
    columns["size"][freed_at] = columns["size"][freed_block]
    kept = np.ones(rows, dtype=bool)
    kept[double_free] = False
    put = np.zeros(rows, dtype=np.int64)                 # rows put before each event
    put[missed_at] = 1
    emitted = kept + put
    offsets = np.empty(rows + 1, dtype=np.int64)
    offsets[0] = len(before_trace)
    np.cumsum(emitted, out=offsets[1:])
    offsets[1:] += len(before_trace)
    total = int(offsets[-1])
    out = {name: np.empty(total, dtype=column.dtype) for name, column in columns.items()}
    out_floats = np.empty(total, dtype=bool)
    # the blocks from before the trace: allocated at its first event's time
    head = slice(0, len(before_trace))
    out["action"][head] = ALLOC
    for name in ("addr", "size", "stream"):
        out[name][head] = columns[name][before_trace]
    out["time"][head] = times[0]
    out_floats[head] = floats[0]
    # each missed free: the block's free, at the time of the alloc that shows it was missed
    at = offsets[missed_at]
    out["action"][at] = FREE_COMPLETED
    for name in ("addr", "size", "stream"):
        out[name][at] = columns[name][missed_block]
    out["time"][at] = times[missed_at]
    out_floats[at] = floats[missed_at]
    # the trace's own events, less the double frees
    source = np.flatnonzero(kept)
    at = offsets[source] + put[source]
    for name, column in columns.items():
        out[name][at] = column[source]
    out_floats[at] = floats[source]
    raw = {"rows": total, **out}
    return from_event_columns(raw, out_floats), offsets


def _notes(addr, size, before_trace, double_free, missed_at, missed_block, freed_at,
           freed_block, where) -> list[str]:
    """One line per kind of change, naming its first event (counted from 1 in the order the
    trace is replayed)."""
    notes = []
    if len(before_trace):
        i = int(before_trace[0])
        notes.append(f"{_count(before_trace, 'free')} of an address the trace had not allocated "
                     f"(first: event {i + 1}, {where(addr, size, i)}): read as block(s) "
                     "allocated before the trace began, live from its start as PyTorch's "
                     "memory viewer shows them")
    if len(missed_at):
        i, j = int(missed_at[0]), int(missed_block[0])
        notes.append(f"{_count(missed_at, 'alloc')} at an address whose block was still live "
                     f"(first: event {i + 1}, {where(addr, size, i)}, while event {j + 1}'s "
                     f"{int(size[j])} B block was): the trace misses that block's free; it is "
                     "freed just before")
    if len(double_free):
        i = int(double_free[0])
        notes.append(f"{_count(double_free, 'free')} of an address already freed (first: "
                     f"event {i + 1}, {where(addr, size, i)}): ignored")
    if len(freed_at):
        i, j = int(freed_at[0]), int(freed_block[0])
        notes.append(f"{_count(freed_at, 'free')} naming another size than its block's "
                     f"(first: event {i + 1} says {int(size[i])} B of event {j + 1}'s "
                     f"{int(size[j])} B): the block's size is freed")
    return notes


def _count(found: np.ndarray, what: str) -> str:
    return f"1 {what}" if len(found) == 1 else f"{len(found):,} {what}s"


def _block(addr, size, i: int) -> str:
    return f"{int(size[i])} B at {int(addr[i]):#x}"


def _line(addr, size, i: int) -> str:
    return f"{int(size[i])} B, the buffer on line {int(addr[i])}"
