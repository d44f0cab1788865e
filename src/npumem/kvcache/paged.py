"""Paged KV cache: fixed-size blocks, a block table per sequence, copy-on-write forks."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..runtime import memory as rt_memory
from .base import D2D, KVCache, _positive


@dataclasses.dataclass
class _Sequence:
    blocks: list[int]              # device addresses, in token order
    length: int = 0


class PagedKVCache(KVCache):
    """Each block holds `block_size` tokens: all their keys, then all their values.

    A sequence takes a new block only when its last one is full, so at most `block_size - 1`
    token slots per sequence are ever unused. Blocks come from the device's caching pool and go
    back to it when no sequence uses them. `fork` shares every block; the shared, partly filled
    last block is copied the first time either sequence appends to it.

        cache = PagedKVCache(num_heads=32, head_dim=128, num_layers=40, block_size=16)
        cache.extend("req-1", prompt_keys, prompt_values)     # (tokens, 40, 32, 128) each
        cache.append("req-1", k, v)                           # one decoding step
        keys, values = cache.gather("req-1")
    """

    def __init__(self, num_heads: int, head_dim: int, *, num_layers: int = 1,
                 block_size: int = 16, dtype="float16", device: int | None = None):
        super().__init__(num_heads, head_dim, num_layers=num_layers, dtype=dtype, device=device)
        self.block_size = _positive(block_size, "block_size")
        self.block_bytes = 2 * self.block_size * self.token_bytes
        self._refs: dict[int, int] = {}          # block -> sequences using it
        self._filled: dict[int, int] = {}        # block -> token slots written
        self.copy_on_write = 0

    @property
    def reserved_bytes(self) -> int:
        return len(self._refs) * self.block_bytes

    @property
    def used_bytes(self) -> int:
        return 2 * self.token_bytes * sum(self._filled.values())

    def stats(self) -> dict:
        return {**super().stats(), "blocks": len(self._refs), "block_bytes": self.block_bytes,
                "copy_on_write": self.copy_on_write}

    def block_table(self, seq_id) -> list[int]:
        """Device addresses of the sequence's blocks, for a paged attention kernel."""
        self._check_known(seq_id)
        return list(self._sequences[seq_id].blocks)

    def _key_slot(self, block: int, slot: int) -> int:
        return block + slot * self.token_bytes

    def _value_slot(self, block: int, slot: int) -> int:
        return block + (self.block_size + slot) * self.token_bytes

    # --- writing ---------------------------------------------------------------------------

    def extend(self, seq_id, keys, values) -> None:
        count, key_src, value_src = self._sources(keys, values)
        seq = self._sequences.get(seq_id) or _Sequence([])
        new_blocks = self._blocks_for(seq, count)      # all memory first: an OOM changes nothing
        seq.blocks.extend(new_blocks)
        for block in new_blocks:
            self._refs[block], self._filled[block] = 1, 0
        self._sequences[seq_id] = seq
        done = 0
        while done < count:
            block = seq.blocks[(seq.length + done) // self.block_size]
            slot = (seq.length + done) % self.block_size
            run = min(self.block_size - slot, count - done)
            self._write(self._key_slot(block, slot), key_src, done, run)
            self._write(self._value_slot(block, slot), value_src, done, run)
            self._filled[block] = slot + run
            done += run
        seq.length += count
        self.appends += count

    def _blocks_for(self, seq: _Sequence, count: int) -> list[int]:
        """New blocks `count` more tokens need, allocated before anything changes (an OOM
        leaves the cache as it was). A shared, partly filled last block is replaced by a copy."""
        slot = seq.length % self.block_size
        copy_tail = bool(slot and count and self._refs[seq.blocks[-1]] > 1)
        room = self.block_size - slot if slot else 0
        needed = -(-max(count - room, 0) // self.block_size)      # ceiling division
        blocks = []
        try:
            if copy_tail:
                blocks.append(self._copy_of(seq.blocks[-1], slot))
            for _ in range(needed):
                blocks.append(self._allocate(self.block_bytes))
        except BaseException:
            for block in blocks:
                self._release(block)
            raise
        if copy_tail:
            self._refs[seq.blocks.pop()] -= 1
            self.copy_on_write += 1
        return blocks

    def _copy_of(self, block: int, tokens: int) -> int:
        """A new block holding the first `tokens` keys and values of `block`."""
        copy, nbytes = self._allocate(self.block_bytes), tokens * self.token_bytes
        rt_memory.memcpy(copy, nbytes, block, nbytes, D2D)
        rt_memory.memcpy(self._value_slot(copy, 0), nbytes, self._value_slot(block, 0), nbytes, D2D)
        return copy

    # --- sequences -------------------------------------------------------------------------

    def fork(self, parent, child) -> None:
        """Start `child` as a copy of `parent` that shares its blocks until one of them writes."""
        self._check_known(parent)
        self._check_new(child)
        source = self._sequences[parent]
        for block in source.blocks:
            self._refs[block] += 1
        self._sequences[child] = _Sequence(list(source.blocks), source.length)

    def free(self, seq_id) -> None:
        """Drop a sequence; blocks no other sequence shares go back to the pool."""
        self._check_known(seq_id)
        for block in self._sequences.pop(seq_id).blocks:
            self._refs[block] -= 1
            if not self._refs[block]:
                del self._refs[block], self._filled[block]
                self._release(block)

    # --- reading ---------------------------------------------------------------------------

    def gather(self, seq_id) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the sequence's keys and values, each (tokens, *token_shape)."""
        self._check_known(seq_id)
        seq = self._sequences[seq_id]
        keys, values = self._empty_tokens(seq.length), self._empty_tokens(seq.length)
        for index, block in enumerate(seq.blocks):
            first = index * self.block_size
            run = min(self.block_size, seq.length - first)
            if run > 0:
                self._read(keys, first, self._key_slot(block, 0), run)
                self._read(values, first, self._value_slot(block, 0), run)
        return self._as_tokens(keys), self._as_tokens(values)
