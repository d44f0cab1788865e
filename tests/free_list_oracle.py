"""The free list as it was written in Python, before it moved to C (src/npumem/alloc/_free_list.c):
the oracle of tests/test_free_list.py's differential tests, and nothing else."""

from __future__ import annotations

from bisect import bisect_left

from npumem.alloc.block import Block

_ADDRESS_BITS = 64      # a key is size << 64 | start: one int, ordered by (size, start)


class OracleFreeList:
    """Free blocks ordered by (size, start) for best-fit and first-fit lookups.

    Parallel lists in that order: int keys (size << 64 | start; ints, not tuples, because int
    comparisons are several times cheaper), the blocks and their starts (so first fit's min over
    the starts of the large-enough blocks runs at C speed). A block that grows by a merge or
    shrinks by a split is re-keyed where it stands when the order allows, which is the common
    case, instead of being removed and inserted again: this runs on every allocate and free.
    """

    __slots__ = ("_keys", "_blocks", "_starts", "_spare", "_cut")

    def __init__(self):
        self._keys: list[int] = []
        self._blocks: list[Block] = []
        self._starts: list[int] = []
        # A free block absorbed by a merge, kept for reuse as the rest of the next split: a
        # cache-hit pair cuts a rest from a free block and merges it back, and making and
        # dropping a Block object each time was a tenth of the pair. Nothing holds absorbed
        # blocks (the lists are walked under the pool's lock, or checked after an unlocked walk).
        self._spare: Block | None = None
        self._cut = 0        # the slot of the last split's rest: where its merge looks first

    def largest_first(self):
        """The free blocks, largest first."""
        return reversed(self._blocks)

    def largest(self) -> int:
        """The size of the largest free block (0 when there is none)."""
        return self._blocks[-1].size if self._blocks else 0

    def _index(self, block: Block) -> int:
        return bisect_left(self._keys, block.size << _ADDRESS_BITS | block.start)

    def add(self, block: Block) -> None:
        key = block.size << _ADDRESS_BITS | block.start
        i = bisect_left(self._keys, key)
        self._keys.insert(i, key)
        self._blocks.insert(i, block)
        self._starts.insert(i, block.start)

    def remove(self, block: Block) -> None:
        self._pop(self._index(block))

    def _pop(self, i: int) -> Block:
        del self._keys[i]
        del self._starts[i]
        return self._blocks.pop(i)

    def _rekey(self, i: int, block: Block) -> None:
        """Put `block` (its size just changed) in slot i, which held a key near its own."""
        keys = self._keys
        key = block.size << _ADDRESS_BITS | block.start
        if (i == 0 or keys[i - 1] < key) and (i + 1 == len(keys) or key < keys[i + 1]):
            keys[i] = key
            self._blocks[i] = block
            self._starts[i] = block.start
            return
        del keys[i]
        del self._blocks[i]
        del self._starts[i]
        i = bisect_left(keys, key)
        keys.insert(i, key)
        self._blocks.insert(i, block)
        self._starts.insert(i, block.start)

    def take(self, size: int, split_min: int, below: int | None = None,
             first_fit: bool = False) -> Block | None:
        """Remove and return the best fit for `size` bytes (the smallest free block that is
        large enough, lowest address among equals), cut to `size` when the rest is at
        least `split_min` bytes (the rest stays cached). With `below`, a best fit of that many
        bytes or more is not used (max_split_size_mb). With `first_fit`, take instead the
        lowest-addressed block that is large enough."""
        # the fit, the split and the re-key written out: this runs on every allocate
        keys = self._keys
        i = bisect_left(keys, size << _ADDRESS_BITS)
        count = len(keys)
        if i == count:
            return None
        if first_fit and i + 1 < count:
            starts = self._starts[i:]
            i += starts.index(min(starts))
        blocks = self._blocks
        block = blocks[i]
        whole = block.size
        if below is not None and whole >= below:
            return None
        rest_size = whole - size
        if rest_size < split_min:
            return self._pop(i)
        following = block.next
        start = block.start + size
        rest = self._spare
        if rest is None:
            rest = Block(start, rest_size, block.segment, block, following)
        else:                   # the block object the last merge let go (see merge_and_add)
            self._spare = None
            rest.start = start
            rest.size = rest_size
            rest.segment = block.segment
            rest.prev = block
            rest.next = following
        if following is not None:
            following.prev = rest
        block.next = rest
        block.size = size
        # the rest's key is below the block's, so it keeps slot i unless it falls below slot i-1
        key = rest_size << _ADDRESS_BITS | start
        if i == 0 or keys[i - 1] < key:
            keys[i] = key
            blocks[i] = rest
            self._starts[i] = start
            self._cut = i
        else:
            self._pop(i)
            self.add(rest)
        return block

    def fit(self, size: int, below: int | None = None, first_fit: bool = False) -> Block | None:
        """The block `take` would cut `size` bytes from, left in the list (None if none)."""
        i = self._fit(size, below, first_fit)
        return self._blocks[i] if i >= 0 else None

    def _fit(self, size: int, below: int | None, first_fit: bool) -> int:
        keys = self._keys
        i = bisect_left(keys, size << _ADDRESS_BITS)
        count = len(keys)
        if i == count:
            return -1
        if first_fit and i + 1 < count:
            starts = self._starts[i:]
            i += starts.index(min(starts))
        if below is not None and self._blocks[i].size >= below:
            return -1
        return i

    def at_least(self, size: int) -> list[Block]:
        """Free blocks of at least `size` bytes, smallest first."""
        return self._blocks[bisect_left(self._keys, size << _ADDRESS_BITS):]

    def merge_and_add(self, block: Block) -> None:
        """Add a freed block, first absorbing free neighbours (which must be in this list)."""
        following, previous = block.next, block.prev
        prev_free = previous is not None and not previous.allocated
        if following is not None and not following.allocated:
            keys = self._keys
            if not prev_free:
                # the common case on a cache hit: the block rejoins the rest it was cut from
                # (found where the last split left it, else by its key), and takes the rest's
                # slot when its (larger) key stays below slot i+1's
                blocks = self._blocks
                i = self._cut
                if i >= len(blocks) or blocks[i] is not following:
                    i = bisect_left(keys, following.size << _ADDRESS_BITS | following.start)
                size = block.size + following.size
                block.size = size
                block.next = after = following.next
                if after is not None:
                    after.prev = block
                start = block.start
                key = size << _ADDRESS_BITS | start
                if i + 1 == len(keys) or key < keys[i + 1]:
                    keys[i] = key
                    blocks[i] = block
                    self._starts[i] = start
                else:
                    self._pop(i)
                    self.add(block)
                # absorbed: the next split's rest, not a new Block; it keeps nothing of its
                # old chain meanwhile (a released segment must not stay alive through it)
                following.segment = following.prev = following.next = None
                self._spare = following
                return
            i = bisect_left(keys, following.size << _ADDRESS_BITS | following.start)
            block.absorb_next()
            self._pop(i)
            i = self._index(previous)
            previous.absorb_next()
            self._rekey(i, previous)
        elif prev_free:
            i = self._index(previous)
            previous.absorb_next()
            self._rekey(i, previous)
        else:
            self.add(block)
