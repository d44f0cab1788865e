"""KV caches for incremental decoding on npumem device memory.

`PagedKVCache` keeps each sequence's keys and values in fixed-size blocks listed in a block
table (vLLM's layout): memory grows a block at a time, freed blocks go straight back to the
pool, and `fork` shares blocks copy-on-write. `ContiguousKVCache` is the seeds' baseline: one
buffer per sequence that doubles when full. Both report `reserved_bytes`, `used_bytes` and
`waste`, so the two can be compared on one workload (bench/kvcache.py).
"""

from .base import KVCache, KVCacheError
from .contiguous import ContiguousKVCache
from .paged import PagedKVCache

__all__ = ["ContiguousKVCache", "KVCache", "KVCacheError", "PagedKVCache"]
