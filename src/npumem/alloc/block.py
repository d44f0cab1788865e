"""Blocks of a pool and the best-fit index over the free ones.

Blocks of one segment (or one expandable range) form a doubly linked list in address order, so a
freed block finds its neighbours in O(1) to merge. Free blocks are also kept in a `FreeList`
sorted by (size, address): best fit is one bisect, ties going to the lowest address.
"""

from __future__ import annotations

import bisect


class Block:
    """A piece of a segment: allocated to a caller, or free in the cache."""

    __slots__ = ("start", "size", "requested", "allocated", "small", "prev", "next", "stream",
                 "segment", "other_streams", "pending_events")

    def __init__(self, start: int, size: int, stream, segment, prev: "Block | None" = None,
                 next: "Block | None" = None):
        self.start = start
        self.size = size
        self.requested = 0
        self.allocated = False
        self.small = False          # counted in the small pool's statistics
        self.prev = prev
        self.next = next
        self.stream = stream
        self.segment = segment
        self.other_streams: set | None = None    # streams this block was also used on
        self.pending_events: list | None = None   # events to wait for before reuse

    @property
    def end(self) -> int:
        return self.start + self.size

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return f"<Block 0x{self.start:x}+{self.size} {state}>"

    def split(self, size: int) -> "Block":
        """Cut this (free) block after `size` bytes; returns the new remainder block."""
        rest = Block(self.start + size, self.size - size, self.stream, self.segment, self, self.next)
        if self.next is not None:
            self.next.prev = rest
        self.next = rest
        self.size = size
        return rest

    def absorb_next(self) -> None:
        """Merge the following (free) block into this one."""
        following = self.next
        self.size += following.size
        self.next = following.next
        if following.next is not None:
            following.next.prev = self


class FreeList:
    """Free blocks ordered by (size, start) for best-fit lookups."""

    __slots__ = ("_keys", "_blocks", "total")

    def __init__(self):
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[int, Block] = {}
        self.total = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        return (self._blocks[start] for _, start in self._keys)

    def add(self, block: Block) -> None:
        bisect.insort(self._keys, (block.size, block.start))
        self._blocks[block.start] = block
        self.total += block.size

    def remove(self, block: Block) -> None:
        keys = self._keys
        del keys[bisect.bisect_left(keys, (block.size, block.start))]
        del self._blocks[block.start]
        self.total -= block.size

    def best_fit(self, size: int) -> Block | None:
        """The smallest free block of at least `size` bytes (lowest address among equals)."""
        i = bisect.bisect_left(self._keys, (size, 0))
        return self._blocks[self._keys[i][1]] if i < len(self._keys) else None

    def largest(self) -> int:
        return self._keys[-1][0] if self._keys else 0

    def merge_and_add(self, block: Block) -> None:
        """Add a freed block, first absorbing free neighbours (which must be in this list)."""
        following = block.next
        if following is not None and not following.allocated:
            self.remove(following)
            block.absorb_next()
        previous = block.prev
        if previous is not None and not previous.allocated:
            self.remove(previous)
            previous.absorb_next()
            block = previous
        self.add(block)
