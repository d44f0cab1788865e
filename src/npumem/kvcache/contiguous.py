"""The seeds' contiguous KV cache: one buffer per sequence that doubles when it is full."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..runtime import memory as rt_memory
from .base import D2D, KVCache, _positive


@dataclasses.dataclass
class _Buffer:
    pointer: int
    capacity: int                   # tokens; keys first, then values
    length: int = 0


class ContiguousKVCache(KVCache):
    """Each sequence owns one buffer of `capacity` tokens of keys followed by as many values;
    a full buffer is replaced by one `growth` times larger and the tokens copied over (the
    seeds' `expand_capacity(position * 2)`). Simple and fast to read, but on average a quarter
    or more of what it reserves is empty. The baseline the paged cache is measured against."""

    def __init__(self, num_heads: int, head_dim: int, *, num_layers: int = 1,
                 initial_tokens: int = 16, growth: int = 2, dtype="float16",
                 device: int | None = None):
        super().__init__(num_heads, head_dim, num_layers=num_layers, dtype=dtype, device=device)
        self.initial_tokens = _positive(initial_tokens, "initial_tokens")
        self.growth = _positive(growth, "growth")
        if self.growth < 2:
            raise ValueError(f"growth must be at least 2, got {self.growth}")
        self.regrowths = 0

    @property
    def reserved_bytes(self) -> int:
        return 2 * self.token_bytes * sum(b.capacity for b in self._sequences.values())

    @property
    def used_bytes(self) -> int:
        return 2 * self.token_bytes * sum(b.length for b in self._sequences.values())

    def stats(self) -> dict:
        return {**super().stats(), "regrowths": self.regrowths}

    def _values_at(self, buffer: _Buffer) -> int:
        return buffer.pointer + buffer.capacity * self.token_bytes

    def _new_buffer(self, capacity: int, source: _Buffer | None) -> _Buffer:
        buffer = _Buffer(self._allocate(2 * capacity * self.token_bytes), capacity)
        if source is not None and source.length:
            nbytes = source.length * self.token_bytes
            rt_memory.memcpy(buffer.pointer, nbytes, source.pointer, nbytes, D2D)
            rt_memory.memcpy(self._values_at(buffer), nbytes, self._values_at(source), nbytes, D2D)
            buffer.length = source.length
        return buffer

    def extend(self, seq_id, keys, values) -> None:
        count, key_src, value_src = self._sources(keys, values)
        old = self._sequences.get(seq_id)
        buffer = old or self._new_buffer(max(self.initial_tokens, count), None)
        if buffer.length + count > buffer.capacity:
            capacity = buffer.capacity
            while capacity < buffer.length + count:
                capacity *= self.growth
            buffer = self._new_buffer(capacity, old)
            self._release(old.pointer)
            self.regrowths += 1
        self._sequences[seq_id] = buffer
        start = buffer.length * self.token_bytes
        self._write(buffer.pointer + start, key_src, 0, count)
        self._write(self._values_at(buffer) + start, value_src, 0, count)
        buffer.length += count
        self.appends += count

    def fork(self, parent, child) -> None:
        """Start `child` as a full copy of `parent` (contiguous buffers cannot share)."""
        self._check_known(parent)
        self._check_new(child)
        source = self._sequences[parent]
        self._sequences[child] = self._new_buffer(source.capacity, source)

    def free(self, seq_id) -> None:
        self._check_known(seq_id)
        self._release(self._sequences.pop(seq_id).pointer)

    def gather(self, seq_id) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the sequence's keys and values, each (tokens, *token_shape)."""
        self._check_known(seq_id)
        buffer = self._sequences[seq_id]
        keys, values = self._empty_tokens(buffer.length), self._empty_tokens(buffer.length)
        if buffer.length:
            self._read(keys, 0, buffer.pointer, buffer.length)
            self._read(values, 0, self._values_at(buffer), buffer.length)
        return self._as_tokens(keys), self._as_tokens(values)
