"""Blocks and block pools of the PyTorch allocator model.

A pool keeps its free blocks ordered by (stream, size, address), as c10's BlockComparatorSize
does, so best fit is a bisect; unmapped ranges of expandable segments are ordered by
(stream, address). Both are sorted lists of keys plus an address index: the pools of a real
program hold hundreds to a few thousand blocks, where list insertion is cheap.
"""

from __future__ import annotations

from bisect import bisect_left, insort


class Block:
    """A range of a segment: allocated, cached (free) or, in an expandable segment, unmapped."""

    __slots__ = ("addr", "size", "requested", "stream", "pool", "allocated", "mapped", "prev",
                 "next", "segment", "gc_base")

    def __init__(self, addr: int, size: int, stream: int, pool: "BlockPool", segment=None,
                 mapped: bool = True):
        self.addr, self.size, self.stream, self.pool = addr, size, stream, pool
        self.requested = 0
        self.allocated = False
        self.mapped = mapped
        self.prev: Block | None = None
        self.next: Block | None = None
        self.segment = segment              # the ExpandableSegment, or None for a cudaMalloc one
        self.gc_base = 0

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: "Block | None", after: "Block | None") -> None:
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free" if self.mapped else "unmapped"
        return f"Block(0x{self.addr:x}, {self.size}, {state}, stream={self.stream})"


class BlockPool:
    """Free blocks of one size class (small: <= 1 MiB requests, large: the rest), of the default
    pools or of one private pool (`owner`, c10's owner_PrivatePool)."""

    def __init__(self, small: bool, owner=None):
        self.small = small
        self.owner = owner
        self.keys: list[tuple[int, int, int]] = []       # (stream, size, addr), sorted
        self.by_addr: dict[int, Block] = {}
        self.unmapped_keys: list[tuple[int, int]] = []   # (stream, addr), sorted
        self.unmapped: dict[int, Block] = {}
        self.free_block_calls = 0                         # get_free_block calls, for GC ages

    # free, mapped blocks
    def insert(self, block: Block) -> None:
        block.gc_base = self.free_block_calls
        insort(self.keys, (block.stream, block.size, block.addr))
        self.by_addr[block.addr] = block

    def remove(self, block: Block) -> None:
        key = (block.stream, block.size, block.addr)
        index = bisect_left(self.keys, key)
        if index == len(self.keys) or self.keys[index] != key:
            raise AssertionError(f"{block} is not in the {'small' if self.small else 'large'} pool")
        del self.keys[index]
        del self.by_addr[block.addr]

    def lower_bound(self, stream: int, size: int) -> int:
        return bisect_left(self.keys, (stream, size, -1))

    def block_at(self, index: int) -> Block:
        return self.by_addr[self.keys[index][2]]

    # unmapped ranges of expandable segments
    def insert_unmapped(self, block: Block) -> None:
        insort(self.unmapped_keys, (block.stream, block.addr))
        self.unmapped[block.addr] = block

    def remove_unmapped(self, block: Block) -> None:
        index = bisect_left(self.unmapped_keys, (block.stream, block.addr))
        del self.unmapped_keys[index]
        del self.unmapped[block.addr]

    def unmapped_from(self, stream: int):
        """Unmapped blocks of `stream`, lowest address first."""
        index = bisect_left(self.unmapped_keys, (stream, -1))
        while index < len(self.unmapped_keys) and self.unmapped_keys[index][0] == stream:
            yield self.unmapped[self.unmapped_keys[index][1]]
            index += 1
