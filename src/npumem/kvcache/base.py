"""What every KV cache shares: the token layout, input checks, sequence bookkeeping, the numbers."""

from __future__ import annotations

import abc
import operator

import numpy as np

from .. import memory as pool_api
from ..constants import MemcpyKind
from ..ops.tensor import Tensor
from ..dtypes import numpy_dtype
from ..runtime import memory as rt_memory
from ..runtime.state import RUNTIME

H2D, D2H, D2D = MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEVICE_TO_HOST, MemcpyKind.DEVICE_TO_DEVICE


class KVCacheError(KeyError):
    """An unknown or duplicate sequence id."""

    def __str__(self) -> str:          # KeyError would print the message quoted
        return str(self.args[0])


def _positive(value, name: str) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if number <= 0:
        raise ValueError(f"{name} must be a positive integer, got {number}")
    return number


class KVCache(abc.ABC):
    """Keys and values of many sequences; one token holds (num_layers, num_heads, head_dim).

    Subclasses decide the memory layout: how `extend` stores tokens, how `fork` shares or copies
    them, what `free` gives back, and what they count as reserved and used."""

    def __init__(self, num_heads: int, head_dim: int, *, num_layers: int = 1,
                 dtype="float16", device: int | None = None):
        self.token_shape = (_positive(num_layers, "num_layers"), _positive(num_heads, "num_heads"),
                            _positive(head_dim, "head_dim"))
        self.dtype = np.dtype(dtype)
        self.token_bytes = int(np.prod(self.token_shape)) * self.dtype.itemsize
        self.pool = pool_api.get_allocator(device)
        self._sequences: dict = {}       # id -> the subclass's record, which has `.length`
        self.appends = 0

    # --- what subclasses provide -----------------------------------------------------------

    @property
    @abc.abstractmethod
    def reserved_bytes(self) -> int:
        """Device bytes the cache holds for its sequences."""

    @property
    @abc.abstractmethod
    def used_bytes(self) -> int:
        """Bytes holding keys and values (shared tokens counted once)."""

    @abc.abstractmethod
    def extend(self, seq_id, keys, values) -> None:
        """Append several tokens (arrays shaped (tokens, *token_shape)), e.g. a prompt."""

    @abc.abstractmethod
    def fork(self, parent, child) -> None:
        """Start `child` with `parent`'s tokens."""

    @abc.abstractmethod
    def free(self, seq_id) -> None:
        """Drop a sequence and give back the memory only it used."""

    @abc.abstractmethod
    def gather(self, seq_id) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the sequence's keys and values, each (tokens, *token_shape)."""

    # --- sequences -------------------------------------------------------------------------

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._sequences

    def __len__(self) -> int:
        return len(self._sequences)

    def sequences(self) -> list:
        return list(self._sequences)

    def length(self, seq_id) -> int:
        """Tokens cached for `seq_id`."""
        self._check_known(seq_id)
        return self._sequences[seq_id].length

    def append(self, seq_id, key, value) -> None:
        """Append one token's key and value (each shaped like `token_shape`) to `seq_id`,
        starting the sequence if it is new."""
        self.extend(seq_id, self._one_token(key, "key"), self._one_token(value, "value"))

    def close(self) -> None:
        """Free every sequence."""
        for seq_id in self.sequences():
            self.free(seq_id)

    def _check_known(self, seq_id) -> None:
        if seq_id not in self._sequences:
            known = ", ".join(map(repr, list(self._sequences)[:8])) or "none"
            raise KVCacheError(f"sequence {seq_id!r} is not in the cache (it holds "
                               f"{len(self._sequences)} sequence(s): {known})")

    def _check_new(self, seq_id) -> None:
        if seq_id in self._sequences:
            raise KVCacheError(f"sequence {seq_id!r} is already in the cache "
                               f"({self._sequences[seq_id].length} tokens); free it first")

    # --- numbers ---------------------------------------------------------------------------

    @property
    def waste(self) -> float:
        """(reserved - used) / reserved; 0 when nothing is reserved."""
        reserved = self.reserved_bytes
        return (reserved - self.used_bytes) / reserved if reserved else 0.0

    def stats(self) -> dict:
        return {"sequences": len(self), "tokens": sum(s.length for s in self._sequences.values()),
                "reserved_bytes": self.reserved_bytes, "used_bytes": self.used_bytes,
                "waste": self.waste, "appends": self.appends}

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {len(self)} sequences, {self.used_bytes:,} of "
                f"{self.reserved_bytes:,} bytes used ({self.waste:.1%} waste)>")

    # --- bytes -----------------------------------------------------------------------------

    def _one_token(self, value, role: str):
        shape = tuple(value.shape) if isinstance(value, Tensor) else np.shape(value)
        if shape != self.token_shape:
            self._wrong_shape(shape, role, one=True)
        array = value if isinstance(value, Tensor) else np.asarray(value)
        return array.reshape(1, *self.token_shape)

    def _wrong_shape(self, shape, role: str, one: bool = False):
        want = self.token_shape if one else ("tokens", *self.token_shape)
        raise ValueError(f"{role} has shape {tuple(shape)}, this cache stores {want} "
                         f"(num_layers, num_heads, head_dim) per token")

    def _tokens(self, values, role: str):
        """(token count, source): a contiguous host uint8 array or a device tensor address."""
        if isinstance(values, Tensor):
            if values.shape[1:] != self.token_shape or values.ndim != 4:
                self._wrong_shape(values.shape, role)
            if numpy_dtype(values.dtype) != self.dtype or not values.is_contiguous:
                raise ValueError(f"{role}: a device tensor must be contiguous and "
                                 f"{self.dtype.name}, got {numpy_dtype(values.dtype).name}")
            values.storage.wait()           # queued work producing it must have run
            return values.shape[0], values.address
        array = np.asarray(values)
        if array.ndim != 4 or array.shape[1:] != self.token_shape:
            self._wrong_shape(array.shape, role)
        if not np.can_cast(array.dtype, self.dtype, "same_kind"):
            raise ValueError(f"{role} is {array.dtype.name}; this cache stores {self.dtype.name}")
        return array.shape[0], np.ascontiguousarray(array, dtype=self.dtype).reshape(-1).view(np.uint8)

    def _sources(self, keys, values):
        count, key_src = self._tokens(keys, "keys")
        value_count, value_src = self._tokens(values, "values")
        if value_count != count:
            raise ValueError(f"keys hold {count} tokens but values hold {value_count}")
        return count, key_src, value_src

    def _write(self, dst: int, source, first_token: int, tokens: int) -> None:
        """Copy `tokens` tokens of `source` (from `_tokens`) starting at `first_token` to `dst`."""
        nbytes = tokens * self.token_bytes
        start = first_token * self.token_bytes
        if isinstance(source, np.ndarray):
            rt_memory.memcpy(dst, nbytes, source[start:start + nbytes], nbytes, H2D)
        else:
            rt_memory.memcpy(dst, nbytes, source + start, nbytes, D2D)

    def _read(self, out: np.ndarray, first_token: int, src: int, tokens: int) -> None:
        nbytes = tokens * self.token_bytes
        start = first_token * self.token_bytes
        rt_memory.memcpy(out[start:start + nbytes], nbytes, src, nbytes, D2H)

    def _empty_tokens(self, tokens: int) -> np.ndarray:
        return np.empty(tokens * self.token_bytes, np.uint8)

    def _as_tokens(self, raw: np.ndarray) -> np.ndarray:
        return raw.view(self.dtype).reshape(-1, *self.token_shape)

    def _allocate(self, nbytes: int) -> int:
        return self.pool.allocate(nbytes, RUNTIME.stream(None, "kv cache"))

    def _release(self, pointer: int) -> None:
        if self.pool.owns(pointer):         # not already gone with its device
            self.pool.deallocate(pointer)
