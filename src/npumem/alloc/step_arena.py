"""Where a step's layout lives, and handing out its planned blocks.

- `PoolRangeArena` (expandable pools): the layout was planned around the blocks live in the
  stream's own address range, so it fills the holes long-lived blocks left there. At takeover
  the byte ranges the layout uses are carved out of the pool's free blocks — those a pinned
  block (the previous step's instance of a slot crossing the cut) still holds, once it is freed.
  Their pages are mapped as planned blocks first need them, and only while reserved memory
  stays within the peak the pool had reached. The ranges go back to the pool's free list when
  the plan is dropped.
- `SegmentsArena` (segment pools, backends without virtual memory, the torch backends): the
  layout was planned into the free space of the stream's segments, laid end to end on a line
  (`SegmentLine`), around their live blocks; what does not fit goes into one new segment, made
  only if it fits under that peak. Its ranges are carved out as in `PoolRangeArena`.

Either way a planned block is handed out only if no live planned block overlaps it (one may
outlive its plan), so memory stays correct whatever the program does. A free run may also be
lent to a request the step did not foresee (`lend`), under the same rule.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

from ..planning.placement import lowest_gap
from .block import Block
from .expandable import _runs
from .step_plan import PAGE, StepLayout, live_together

WALL = 512          # line bytes between two segments, held: no planned block spans two
_BEYOND = 1 << 62    # past every address


def _carved_rest(block: Block, size: int) -> Block:
    """Split a carved block after `size` bytes; the rest stays carved (allocated)."""
    rest = block.split(size)
    rest.allocated, rest.requested, rest.small = True, 0, False
    return rest


class ArenaSegment:
    """What a planned Block's `segment` is: the pool returns freed blocks to `free` (the
    Predictor), which finds their `arena`."""

    __slots__ = ("stream", "free", "arena")

    def __init__(self, stream, free, arena):
        self.stream, self.free, self.arena = stream, free, arena


class StepArena:
    """Planned blocks at `addresses` (one per slot); live ones tracked by address."""

    def __init__(self, pool, layout: StepLayout, stream, owner, addresses: list[int]):
        self.pool, self.owner, self.stream, self.layout = pool, owner, stream, layout
        segment = ArenaSegment(stream, owner, self)
        self.blocks = [Block(address, size, segment)
                       for address, size in zip(addresses, layout.template.sizes)]
        self.live_starts: list[int] = []
        self.live_ends: list[int] = []
        self.awaited: set[int] = set()        # pool blocks whose frees the arena waits for
        self.slot_ready = [False] * len(self.blocks)   # pages known to be mapped
        # live blocks handed out off their slot's place (place_elsewhere, lend), by start
        self.elsewhere: dict[int, Block] = {}
        self.lent: set[int] = set()           # the starts of those lent (see lend)

    def place(self, slot: int) -> Block | None:
        """Slot `slot`'s block, if no live planned block overlaps it and its memory is there."""
        block = self.blocks[slot]
        start, end = block.start, block.start + block.size
        starts = self.live_starts
        at = bisect_left(starts, start)
        if (at < len(starts) and starts[at] < end) or (at and self.live_ends[at - 1] > start):
            return None
        if not self.slot_ready[slot]:             # its pages were mapped already: skip the check
            if not self.ensure_mapped(block):
                return None
            self.slot_ready[slot] = True
        starts.insert(at, start)
        self.live_ends.insert(at, end)
        return block

    def remove(self, block: Block) -> None:
        at = bisect_left(self.live_starts, block.start)
        del self.live_starts[at], self.live_ends[at]
        if self.elsewhere:
            self.elsewhere.pop(block.start, None)
            self.lent.discard(block.start)

    def lent_over(self, slot: int) -> bool:
        """Whether a block lent to a request the step did not foresee holds bytes of `slot`'s."""
        block = self.blocks[slot]
        return any(start < block.end and block.start < self.elsewhere[start].end
                   for start in self.lent)

    def ensure_mapped(self, block: Block) -> bool:
        return True

    def unmap_idle_pages(self) -> None:
        """Give back pages no live planned block needs (where that is possible)."""

    def shrink(self) -> None:
        """A retired arena: give back what no live planned block uses (where possible)."""

    def _free_runs_in(self, low: int, high: int):
        """(start, end) of the free bytes in [low, high), between live planned blocks."""
        at = max(bisect_left(self.live_starts, low) - 1, 0)
        position = low
        for start, end in zip(self.live_starts[at:], self.live_ends[at:]):
            if start >= high:
                break
            if start > position:
                yield position, start
            position = max(position, end)
        if position < high:
            yield position, high

    def pieces_in(self, low: int, high: int, free_segment) -> list[Block]:
        """The live blocks (at their slots' places or elsewhere) and the free runs in [low, high),
        in address order."""
        live = {block.start: block for block in self.blocks if block.allocated}
        live.update(self.elsewhere)
        pieces = [Block(start, end - start, free_segment)
                  for start, end in self._free_runs_in(low, high)]
        pieces += [live[start] for start in self.live_starts if low <= start < high and start in live]
        return sorted(pieces, key=lambda block: block.start)


class PoolRangeArena(StepArena):
    """The layout inside the stream's expandable address range (`range_`, an expandable Arena);
    the byte ranges it uses are carved out of the pool's free blocks."""

    def __init__(self, pool, layout: StepLayout, stream, owner, range_, pinned: set[int]):
        self.range, self.strategy = range_, pool._strategy
        self._init_carving(pool, layout, stream, owner, [range_.base + offset for offset in
                                                          layout.offsets], pinned)

    def _init_carving(self, pool, layout, stream, owner, addresses, pinned: set[int]) -> None:
        StepArena.__init__(self, pool, layout, stream, owner, addresses)
        self.carved: list[Block] = []
        self.carved_ids: set[int] = set()
        self.size = 0
        self.unclaimed = _union(addresses, layout.template.sizes)   # byte ranges not carved yet
        self.lifetimes = self.spans = None     # for place_elsewhere, made when first needed
        self.awaited = {pointer for pointer in pinned if pointer in pool._allocated}
        self.claim()

    @staticmethod
    def blocked(blocks, addresses: list[int | None], layout: StepLayout, pinned: set[int]) -> bool:
        """Whether a live pool block (of `blocks`) other than the pinned ones holds bytes the
        layout, at `addresses` (None: elsewhere), uses: one that moved in after it was planned."""
        held = sorted((block.start, block.end) for block in blocks
                      if block.allocated and block.start not in pinned)
        starts = [start for start, _ in held]
        placed = [(address, size) for address, size in zip(addresses, layout.template.sizes)
                  if address is not None]
        for low, high in _union([address for address, _ in placed], [size for _, size in placed]):
            at = bisect_left(starts, high)
            if at and held[at - 1][1] > low:
                return True
        return False

    def claim(self) -> None:
        """Carve the parts of the unclaimed ranges that are free now. The rest is held by the
        pinned blocks of the step before the plan took over; planned blocks there are misses
        until those are freed (on_free)."""
        left, after = [], None
        for low, high in self.unclaimed:         # in address order: one walk along the blocks
            blocks = list(self._blocks_in(low, high, after))
            after = blocks[-1] if blocks else after  # (carving keeps a block's start)
            for block in blocks:
                piece = (max(block.start, low), min(block.end, high))
                if block.allocated:
                    left.append(piece)
                else:
                    self._carve(block, *piece)
        self.unclaimed = left

    def _blocks_in(self, low: int, high: int, after: Block | None = None):
        """The pool's blocks of the range that overlap [low, high), in address order; `after`,
        a block of the range below `low`, is where the walk may begin."""
        return _blocks_from(after or self.range.first, low, high)

    def on_free(self, pointer: int) -> None:
        """A pinned pool block was freed: claim what it held."""
        self.awaited.discard(pointer)
        self.claim()

    @staticmethod
    def bytes_needed(range_, blocks, layout: StepLayout, shift: int) -> int:
        """Bytes of the pages the range needs with the layout in place: every page a live
        block (of the range's `blocks`) or a planned range touches."""
        touched = bytearray(len(range_.mapped))
        spans = [(block.start, block.end) for block in blocks if block.allocated]
        planned = _union([range_.base + offset for offset in layout.offsets], layout.template.sizes)
        for low, high in spans + planned:
            first, end = (low - range_.base) >> shift, ((high - 1 - range_.base) >> shift) + 1
            touched[first:end] = b"\x01" * (end - first)
        return touched.count(1) << shift

    def _carve(self, block: Block, low: int, high: int) -> None:
        """Take [low, high) out of the free `block` holding it."""
        free = block.segment.free
        free.remove(block)
        if block.start < low:
            rest = block.split(low - block.start)
            free.add(block)
            block = rest
        if block.end > high:
            free.add(block.split(high - block.start))
        block.allocated, block.requested, block.small = True, 0, False
        self.carved.append(block)
        self.carved_ids.add(id(block))
        self.size += block.size

    def place(self, slot: int) -> Block | None:
        if self.unclaimed:
            block = self.blocks[slot]
            at = bisect_left(self.unclaimed, (block.start + block.size,))
            if at and self.unclaimed[at - 1][1] > block.start:
                return None                   # a pinned pool block still holds some of it
        return super().place(slot)

    def place_elsewhere(self, slot: int) -> Block | None:
        """A block for `slot` elsewhere in the carved ranges, when its own place is still held
        (a block that outlived its plan, or a pinned pool block): the lowest free run that no
        block planned to live at the same time as this one uses, so the rest of the step still
        finds its places. None if there is no such run."""
        self._index_lifetimes()
        together = self.spans[live_together(*self.lifetimes, slot)]
        return self._hand_out(self._free_run(together, self.blocks[slot].size),
                              self.blocks[slot].size)

    def lend(self, size: int, slot: int) -> Block | None:
        """A block of `size` bytes for a request the step did not foresee, made just before
        `slot`'s (a one-off temporary): the lowest free run that stays clear the longest of
        the planned blocks to come, so that the pool needs no new memory beside the plan. None
        if no free run is clear of the next slot's block."""
        self._index_lifetimes()
        starts, _, length = self.lifetimes
        soonest = np.argsort((starts - starts[slot]) % length, kind="stable")
        # the most slots, in the order they come, whose blocks a free run can stay clear of
        low, high, address = 1, len(soonest), None
        while low <= high:
            middle = (low + high) // 2
            found = self._free_run(self.spans[soonest[:middle]], size)
            if found is None:
                high = middle - 1
            else:
                low, address = middle + 1, found
        block = self._hand_out(address, size)
        if block is not None:
            self.lent.add(block.start)
        return block

    def _index_lifetimes(self) -> None:
        if self.lifetimes is None:
            template = self.layout.template
            self.lifetimes = (np.asarray(template.starts, np.int64),
                              np.asarray(template.ends, np.int64), template.length)
            self.spans = np.array([(block.start, block.end) for block in self.blocks],
                                  np.int64).reshape(-1, 2)

    def _free_run(self, spans: np.ndarray, size: int) -> int | None:
        """The lowest address of the carved ranges with `size` bytes clear of the live blocks
        and of `spans` (start, end)."""
        return _lowest_free_run(
            np.concatenate([spans[:, 0], np.asarray(self.live_starts, np.int64)]),
            np.concatenate([spans[:, 1], np.asarray(self.live_ends, np.int64)]),
            self._carved_ranges(), size)

    def _hand_out(self, address: int | None, size: int) -> Block | None:
        """A live block of the arena at `address` (None: none), once its pages are mapped."""
        if address is None:
            return None
        block = Block(address, size, self.blocks[0].segment)
        if not self.ensure_mapped(block):
            return None
        at = bisect_left(self.live_starts, address)
        self.live_starts.insert(at, address)
        self.live_ends.insert(at, address + size)
        self.elsewhere[address] = block
        return block

    def _carved_ranges(self) -> list[tuple[int, int]]:
        """The carved byte ranges in address order, merged inside each segment (segments may
        touch, but a block must not span two)."""
        by_segment: dict[int, list[Block]] = {}
        for block in self.carved:
            by_segment.setdefault(id(block.segment), []).append(block)
        return sorted(span for blocks in by_segment.values()
                      for span in _union([block.start for block in blocks],
                                         [block.size for block in blocks]))

    def ensure_mapped(self, block: Block) -> bool:
        range_, shift = self.range, self.strategy.shift
        offset = block.start - range_.base
        first, end = offset >> shift, ((offset + block.size - 1) >> shift) + 1
        if range_.mapped.find(0, first, end) < 0:
            return True
        pool = self.pool
        need = sum(count for _, count in _runs(range_.mapped, 0, first, end)) << shift
        within = min(max(self.owner.peak_before, need), pool.limit)
        if pool.stats.current("reserved_bytes") + need > within:
            pool.release_idle_cache()
            self.unmap_idle_pages()
            if pool.stats.current("reserved_bytes") + need > within:
                return False
        return self.strategy._map(range_, first, end)

    def unmap_idle_pages(self) -> None:
        shift, base, idle = self.strategy.shift, self.range.base, []
        page = 1 << shift
        for carved in self.carved:
            for low, high in self._free_runs_in(carved.start, carved.end):
                first, end = (low - base + page - 1) >> shift, (high - base) >> shift
                if first < end:
                    idle += _runs(self.range.mapped, 1, first, end)
        if idle:
            self.strategy.unmap_runs(self.range, idle)
            self.slot_ready = [False] * len(self.blocks)

    def shrink(self) -> None:
        """Give the pool back the carved bytes no live planned block uses, so a retired plan
        holds only what its last blocks need while they drain."""
        kept = []
        for carved in self.carved:
            block, free = carved, carved.segment.free
            for low, high in list(self._free_runs_in(carved.start, carved.end)):
                if block.start < low:             # a live planned block's bytes: keep them
                    kept.append(block)
                    block = _carved_rest(block, low - block.start)
                rest = _carved_rest(block, high - block.start) if block.end > high else None
                block.allocated = False
                free.merge_and_add(block)
                block = rest
                if block is None:
                    break
            if block is not None:
                kept.append(block)
        self.carved, self.carved_ids = kept, {id(block) for block in kept}
        self.size = sum(block.size for block in kept)
        self.unclaimed, self.awaited = [], set()

    def release(self) -> None:
        """The carved ranges go back to the pool's free list (their pages stay mapped, the
        pool's to unmap when idle)."""
        for block in self.carved:
            block.allocated = False
            block.segment.free.merge_and_add(block)
        self.carved, self.carved_ids, self.size, self.unclaimed = [], set(), 0, []
        self.awaited = set()

    def views(self):
        return []         # inside the pool's own ranges: see refine

    def refine(self, blocks):
        """The pool's blocks of this range, with each carved range shown as its planned blocks
        and free runs."""
        if not self.carved_ids:
            return blocks
        out, free_segment = [], ArenaSegment(self.stream, None, self)
        for block in blocks:
            if id(block) in self.carved_ids:
                out += self.pieces_in(block.start, block.end, free_segment)
            else:
                out.append(block)
        return out


def _blocks_from(block: Block, low: int, high: int):
    """The blocks of the linked list starting at `block` that overlap [low, high)."""
    while block is not None and block.end <= low:
        block = block.next
    while block is not None and block.start < high:
        yield block
        block = block.next


def _lowest_free_run(starts, ends, carved: list[tuple[int, int]], size: int) -> int | None:
    """The lowest address inside the `carved` (start, end) ranges (merged, in address order)
    with `size` bytes clear of every [starts, ends) span; None if there is none."""
    if not carved:
        return None
    outside = np.array(carved, np.int64)         # the space between carved ranges is not ours
    edges_start = np.concatenate([[0], outside[:, 1]])
    edges_end = np.concatenate([outside[:, 0], [_BEYOND]])
    address = lowest_gap(np.concatenate([starts, edges_start]),
                         np.concatenate([ends, edges_end]), size)
    return address if address < _BEYOND else None


def _union(addresses: list[int], sizes: list[int]) -> list[tuple[int, int]]:
    """The byte ranges blocks at `addresses` cover, merged, in address order."""
    merged: list[list[int]] = []
    for low, high in sorted((address, address + size) for address, size in zip(addresses, sizes)):
        if merged and low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return [(low, high) for low, high in merged]


class SegmentLine:
    """A stream's segments laid end to end, a WALL apart, so that a step can be planned into
    their free space as into one range; past the end lies the new segment (`extension`) that
    takes what does not fit."""

    def __init__(self, segments):
        self.segments = sorted(segments, key=lambda segment: segment.start)
        self.starts, end = [], 0                 # each segment's line offset
        for segment in self.segments:
            self.starts.append(end)
            end += segment.size + WALL
        self.length = end                        # where the extension begins

    def offset(self, address: int) -> int:
        """The line offset of an address in one of the segments."""
        for start, segment in zip(self.starts, self.segments):
            if segment.start <= address < segment.start + segment.size:
                return start + address - segment.start
        raise ValueError(f"0x{address:x} is in none of the line's segments")

    def taken(self, skip: set[int], refine) -> list[tuple[int, int]]:
        """(offset, size) the plan must go around: the live blocks (but those in `skip`; a
        plan's carved ranges shown as its blocks by `refine`) and the walls."""
        taken = []
        for start, segment in zip(self.starts, self.segments):
            taken += [(start + block.start - segment.start, block.size)
                      for block in refine(segment.blocks())
                      if block.allocated and block.start not in skip]
            taken.append((start + segment.size, WALL))
        return taken

    def extension_bytes(self, layout: StepLayout) -> int:
        """Bytes of the new segment the layout needs past the line (whole pages)."""
        beyond = max(layout.height - self.length, 0)
        return -(-beyond // PAGE) * PAGE

    def addresses(self, layout: StepLayout, extension: int | None) -> list[int | None]:
        """Each slot's address: in a segment, or in the extension (at address `extension`;
        None if there is none yet)."""
        out = []
        for offset in layout.offsets:
            if offset >= self.length:
                out.append(None if extension is None else extension + offset - self.length)
            else:
                at = bisect_right(self.starts, offset) - 1
                out.append(self.segments[at].start + offset - self.starts[at])
        return out

    def still_there(self, strategy) -> bool:
        """Whether every segment of the line is still the pool's (none went back)."""
        return all(strategy.segments.get(segment.start) is segment for segment in self.segments)


class SegmentsArena(PoolRangeArena):
    """The layout in the stream's segments (`line`) and, past them, in `extension` (a new
    segment of the pool, or None); carved like PoolRangeArena's ranges."""

    def __init__(self, pool, layout: StepLayout, stream, owner, line: SegmentLine, extension,
                 pinned: set[int]):
        self.strategy = pool._strategy
        self.containers = sorted(line.segments + ([extension] if extension is not None else []),
                                 key=lambda segment: segment.start)
        addresses = line.addresses(layout, None if extension is None else extension.start)
        self._init_carving(pool, layout, stream, owner, addresses, pinned)

    def _blocks_in(self, low: int, high: int, after: Block | None = None):
        """The blocks of the segments that overlap [low, high), in address order (segments
        may touch, so a merged range can run from one into the next; each is walked from its
        first block)."""
        for segment in self.containers:
            if segment.start < high and low < segment.start + segment.size:
                yield from _blocks_from(segment.first, low, high)

    def ensure_mapped(self, block: Block) -> bool:
        return True

    def unmap_idle_pages(self) -> None:
        """Segments are mapped whole."""
