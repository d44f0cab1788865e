"""KV caches: one conformance suite for the paged and the contiguous cache, then what is paged-only."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import npumem
from npumem import memory as mem
from npumem.errors import MemoryAllocationError
from npumem.kvcache import ContiguousKVCache, KVCacheError, PagedKVCache

HEADS, DIM, LAYERS = 2, 8, 3
TOKEN = (LAYERS, HEADS, DIM)


@pytest.fixture
def rt(any_rt):
    """This module is a conformance suite: every test runs on each backend (conftest.BACKENDS)."""
    return any_rt



def make(kind, **options):
    if kind == "paged":
        return PagedKVCache(HEADS, DIM, num_layers=LAYERS, block_size=options.pop("block_size", 4),
                            **options)
    return ContiguousKVCache(HEADS, DIM, num_layers=LAYERS, initial_tokens=4, **options)


def tokens(count, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((count, *TOKEN)).astype(np.float16),
            rng.standard_normal((count, *TOKEN)).astype(np.float16))


both = pytest.mark.parametrize("kind", ["paged", "contiguous"])


@both
def test_appended_tokens_read_back_exactly(rt, kind):
    cache = make(kind)
    keys, values = tokens(11, 0)
    for k, v in zip(keys, values):
        cache.append("a", k, v)
    got_k, got_v = cache.gather("a")
    assert np.array_equal(got_k, keys) and np.array_equal(got_v, values)
    assert cache.length("a") == 11 and cache.sequences() == ["a"] and "a" in cache


@both
def test_a_prompt_then_decoding(rt, kind):
    cache = make(kind)
    keys, values = tokens(10, 1)
    cache.extend(7, keys[:6], values[:6])
    cache.extend(7, keys[6:9], values[6:9])
    cache.append(7, keys[9], values[9])
    got_k, got_v = cache.gather(7)
    assert np.array_equal(got_k, keys) and np.array_equal(got_v, values)


@both
def test_device_tensors_are_copied_on_the_device(rt, kind):
    cache = make(kind)
    keys, values = tokens(5, 2)
    cache.extend("d", npumem.from_numpy(keys), npumem.from_numpy(values))
    assert np.array_equal(cache.gather("d")[1], values)


@both
def test_fork_copies_and_the_two_sequences_diverge(rt, kind):
    cache = make(kind)
    keys, values = tokens(6, 3)
    more_k, more_v = tokens(2, 4)
    cache.extend("parent", keys, values)
    cache.fork("parent", "child")
    cache.append("child", more_k[0], more_v[0])
    cache.append("parent", more_k[1], more_v[1])
    assert np.array_equal(cache.gather("child")[0], np.concatenate([keys, more_k[:1]]))
    assert np.array_equal(cache.gather("parent")[1], np.concatenate([values, more_v[1:]]))


@both
def test_free_gives_every_byte_back_to_the_pool(rt, kind):
    before = mem.memory_allocated()
    cache = make(kind)
    for seq in range(5):
        cache.extend(seq, *tokens(3 + 4 * seq, seq))
    cache.fork(4, "copy")
    assert mem.memory_allocated() > before and cache.reserved_bytes > 0
    cache.free(0)
    cache.close()
    assert mem.memory_allocated() == before and len(cache) == 0
    assert cache.reserved_bytes == cache.used_bytes == 0 and cache.waste == 0.0


@both
def test_bad_input_is_refused_and_changes_nothing(rt, kind):
    cache = make(kind)
    keys, values = tokens(3, 5)
    cache.extend("s", keys, values)
    state = cache.stats()
    with pytest.raises(KVCacheError, match="sequence 'missing' is not in the cache .* 's'"):
        cache.gather("missing")
    with pytest.raises(KVCacheError, match="already in the cache"):
        cache.fork("s", "s")
    with pytest.raises(ValueError, match=r"shape \(2, 8\), this cache stores \(3, 2, 8\)"):
        cache.append("s", keys[0, 0], values[0])
    with pytest.raises(ValueError, match="keys hold 3 tokens but values hold 2"):
        cache.extend("s", keys, values[:2])
    with pytest.raises(ValueError, match="complex128; this cache stores float16"):
        cache.extend("s", keys.astype(complex), values)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        make(kind, dtype="float16", device=None).__class__(0, DIM)
    assert cache.stats() == state
    assert np.array_equal(cache.gather("s")[0], keys)


@both
def test_out_of_memory_leaves_the_cache_as_it_was(rt, kind):
    # 4 MiB per token of keys: a second paged block or a doubled buffer does not fit in 256 MiB
    big = (PagedKVCache(1024, 1024, num_layers=2, block_size=4, dtype="float16") if kind == "paged"
           else ContiguousKVCache(1024, 1024, num_layers=2, initial_tokens=4, dtype="float16"))
    token = np.ones((2, 1024, 1024), np.float16)
    for _ in range(4):
        big.append("s", token, token)
    state, allocated = big.stats(), mem.memory_allocated()
    with pytest.raises(MemoryAllocationError):
        big.extend("s", np.ones((14, 2, 1024, 1024), np.float16), np.ones((14, 2, 1024, 1024), np.float16))
    assert big.stats() == state and mem.memory_allocated() == allocated
    assert np.array_equal(big.gather("s")[0][3], token)
    big.close()


def test_paged_waste_is_only_the_unfilled_tail_of_each_last_block(rt):
    cache = make("paged", block_size=16)
    lengths = [1, 16, 17, 40, 100]
    for seq, length in enumerate(lengths):
        cache.extend(seq, *tokens(length, seq))
    blocks = sum(math.ceil(n / 16) for n in lengths)
    assert cache.reserved_bytes == blocks * cache.block_bytes
    assert cache.used_bytes == sum(lengths) * 2 * cache.token_bytes
    assert cache.waste == pytest.approx(1 - sum(lengths) / (blocks * 16))
    assert len(cache.block_table(4)) == 7 and cache.stats()["blocks"] == blocks


def test_contiguous_doubles_and_counts_what_it_reserves(rt):
    cache = make("contiguous")
    cache.extend("s", *tokens(3, 0))           # 4 tokens
    cache.extend("s", *tokens(6, 1))           # 9 needed: 4 -> 16 in one regrowth
    assert cache.reserved_bytes == 2 * 16 * cache.token_bytes and cache.regrowths == 1
    assert cache.waste == pytest.approx(7 / 16)


def test_a_fork_shares_blocks_and_copies_only_the_written_tail(rt):
    cache = make("paged", block_size=4)
    cache.extend("p", *tokens(10, 0))           # blocks: 4 + 4 + 2 tokens
    reserved = cache.reserved_bytes
    cache.fork("p", "c")
    assert cache.reserved_bytes == reserved and cache.block_table("c") == cache.block_table("p")
    cache.append("c", *(t[0] for t in tokens(1, 1)))
    assert cache.copy_on_write == 1 and cache.reserved_bytes == reserved + cache.block_bytes
    assert cache.block_table("c")[:2] == cache.block_table("p")[:2]
    assert cache.block_table("c")[2] != cache.block_table("p")[2]
    cache.append("p", *(t[0] for t in tokens(1, 2)))   # the old tail is p's alone now: no copy
    assert cache.copy_on_write == 1
    cache.free("p")
    assert cache.reserved_bytes == 3 * cache.block_bytes


operations = st.lists(st.tuples(st.sampled_from(["append", "extend", "fork", "free"]),
                                st.integers(0, 3), st.integers(0, 3), st.integers(1, 9)),
                      max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, kind=st.sampled_from(["paged", "contiguous"]))
def test_random_workloads_match_a_host_model(rt, ops, kind):
    cache, model = make(kind, block_size=3) if kind == "paged" else make(kind), {}
    before = mem.memory_allocated()
    for step, (op, seq, other, count) in enumerate(ops):
        if op in ("append", "extend"):
            k, v = tokens(1 if op == "append" else count, step)
            if op == "append":
                cache.append(seq, k[0], v[0])
            else:
                cache.extend(seq, k, v)
            old_k, old_v = model.get(seq, (k[:0], v[:0]))
            model[seq] = (np.concatenate([old_k, k]), np.concatenate([old_v, v]))
        elif op == "fork" and seq in model and other not in model:
            cache.fork(seq, other)
            model[other] = model[seq]
        elif op == "free" and seq in model:
            cache.free(seq)
            del model[seq]
    assert sorted(cache.sequences()) == sorted(model)
    for seq, (k, v) in model.items():
        got_k, got_v = cache.gather(seq)
        assert np.array_equal(got_k, k) and np.array_equal(got_v, v)
    assert cache.used_bytes <= cache.reserved_bytes
    if kind == "paged":
        assert sum(map(len, (cache.block_table(s) for s in model))) >= cache.stats()["blocks"]
    cache.close()
    assert mem.memory_allocated() == before
