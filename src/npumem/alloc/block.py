"""Blocks of a pool and the index over the free ones (best fit and first fit).

Blocks of one segment (or one expandable range) form a doubly linked list in address order, so a
freed block finds its neighbours in O(1) to merge. Free blocks are also kept in a `FreeList`
sorted by (size, address): best fit is one lower bound, ties going to the lowest address; first
fit (the lowest address among the blocks large enough) is that bound and a min over their
starts. The FreeList is C (`_free_list.c`): its take and merge run on every allocate and free.
"""

from __future__ import annotations

from .built import native

_free_list = native("_free_list")


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


# The free list reads and writes the blocks' slots directly: it learns where they lie here.
_free_list.bind(Block)
FreeList = _free_list.FreeList
