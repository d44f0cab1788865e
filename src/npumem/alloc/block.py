"""Blocks of a pool and the best-fit index over the free ones.

Blocks of one segment (or one expandable range) form a doubly linked list in address order, so a
freed block finds its neighbours in O(1) to merge. Free blocks are also kept in a `FreeList`
sorted by (size, address): best fit is one bisect, ties going to the lowest address.
"""

from __future__ import annotations

from bisect import bisect_left, insort

_ADDRESS_BITS = 64      # a free-list key is size << 64 | start: one int, ordered by (size, start)
_ADDRESS_MASK = (1 << _ADDRESS_BITS) - 1


class Block:
    """A piece of a segment: allocated to a caller, or free in the cache.

    `segment` is the Segment or expandable Arena the block lies in; it knows the block's stream
    and the FreeList the block returns to. `requested` and `small` are set when it is allocated.
    """

    __slots__ = ("start", "size", "requested", "allocated", "small", "prev", "next", "segment")

    def __init__(self, start: int, size: int, segment, prev: "Block | None" = None,
                 next: "Block | None" = None):
        self.start = start
        self.size = size
        self.segment = segment
        self.prev = prev
        self.next = next
        self.allocated = False

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def stream(self):
        return self.segment.stream

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return f"<Block 0x{self.start:x}+{self.size} {state}>"

    def split(self, size: int) -> "Block":
        """Cut this (free) block after `size` bytes; returns the new remainder block."""
        following = self.next
        rest = Block(self.start + size, self.size - size, self.segment, self, following)
        if following is not None:
            following.prev = rest
        self.next = rest
        self.size = size
        return rest

    def absorb_next(self) -> None:
        """Merge the following (free) block into this one."""
        following = self.next
        self.size += following.size
        self.next = after = following.next
        if after is not None:
            after.prev = self


class FreeList:
    """Free blocks ordered by (size, start) for best-fit lookups.

    The order lives in one sorted list of int keys (size << 64 | start) — ints, not tuples,
    because this runs on every allocate and free and int comparisons are several times cheaper.
    """

    __slots__ = ("_keys", "_blocks", "total")

    def __init__(self):
        self._keys: list[int] = []
        self._blocks: dict[int, Block] = {}
        self.total = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        blocks = self._blocks
        return (blocks[key & _ADDRESS_MASK] for key in self._keys)

    def add(self, block: Block) -> None:
        start, size = block.start, block.size
        insort(self._keys, size << _ADDRESS_BITS | start)
        self._blocks[start] = block
        self.total += size

    def remove(self, block: Block) -> None:
        start, size = block.start, block.size
        keys = self._keys
        del keys[bisect_left(keys, size << _ADDRESS_BITS | start)]
        del self._blocks[start]
        self.total -= size

    def best_fit(self, size: int) -> Block | None:
        """The smallest free block of at least `size` bytes (lowest address among equals)."""
        keys = self._keys
        i = bisect_left(keys, size << _ADDRESS_BITS)
        return self._blocks[keys[i] & _ADDRESS_MASK] if i < len(keys) else None

    def at_least(self, size: int):
        """Free blocks of at least `size` bytes, smallest first."""
        keys, blocks = self._keys, self._blocks
        return [blocks[key & _ADDRESS_MASK] for key in keys[bisect_left(keys, size << _ADDRESS_BITS):]]

    def largest(self) -> int:
        return self._keys[-1] >> _ADDRESS_BITS if self._keys else 0

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
