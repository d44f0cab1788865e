"""StatisticsAdaptor's C counts (_statistics_adaptor.c) against the Python adaptor they replaced.

The oracle below is the former Python StatisticsAdaptor, kept only here: hypothesis drives both
with the same calls, failures of either kind included, and their stats() must agree on every
count (latencies aside, which only have to be sane).

One difference is a fix: when the upstream's free fails, its bytes come back to the count, and
the Python adaptor counted them into total_bytes as if allocated again. The oracle keeps that
and the test takes those bytes off its total."""

import gc
import itertools
import threading
import weakref
from time import perf_counter_ns

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npumem.alloc.adaptors import Adaptor, StatisticsAdaptor
from npumem.alloc.caching_allocator import CachingAllocator
from npumem.alloc.resource import MemoryResource
from npumem.device import SimBackend, SimConfig
from npumem.errors import MemoryFreeError
from npumem.units import MiB

LATENCIES = ("mean_alloc_us", "max_alloc_us", "mean_free_us")


class OracleStatisticsAdaptor(Adaptor):
    """The Python StatisticsAdaptor as it was before its counts moved to C (FOLD_AT and all),
    plus `restored`: the bytes of failed frees it put back (and into total_bytes)."""

    FOLD_AT = 8192

    def __init__(self, upstream: MemoryResource):
        super().__init__(upstream)
        self._sizes: dict[int, int] = {}
        self._changes: list[int] = []
        self._alloc_ns: list[int] = []
        self._free_ns: list[int] = []
        self.allocations = self.frees = self.failures = 0
        self.current_bytes = self.peak_bytes = self.total_bytes = 0
        self.alloc_ns = self.free_ns = self.max_alloc_ns = 0
        self.restored = 0

    def allocate(self, nbytes: int, stream=None) -> int:
        start = perf_counter_ns()
        try:
            pointer = self._upstream.allocate(nbytes, stream)
        except Exception:
            with self.lock:
                self.failures += 1
            raise
        self._alloc_ns.append(perf_counter_ns() - start)
        self._sizes[pointer] = nbytes
        changes = self._changes
        changes.append(nbytes)
        if len(changes) >= self.FOLD_AT:
            with self.lock:
                self._fold()
        return pointer

    def deallocate(self, pointer: int, nbytes: int | None = None, stream=None) -> None:
        size = self._sizes.get(pointer, 0)
        self._changes.append(-size)
        start = perf_counter_ns()
        try:
            self._free_upstream(self._sizes, pointer, nbytes, stream)
        except Exception:
            self._changes.append(size)
            self.restored += size
            raise
        self._free_ns.append(perf_counter_ns() - start)

    @staticmethod
    def _drain(log: list[int]) -> list[int]:
        count = len(log)
        taken = log[:count]
        del log[:count]
        return taken

    def _fold(self) -> None:
        alloc_ns, free_ns = self._drain(self._alloc_ns), self._drain(self._free_ns)
        changes = self._drain(self._changes)
        self.allocations += len(alloc_ns)
        self.alloc_ns += sum(alloc_ns)
        self.max_alloc_ns = max(self.max_alloc_ns, max(alloc_ns, default=0))
        self.frees += len(free_ns)
        self.free_ns += sum(free_ns)
        if changes:
            running = list(itertools.accumulate(changes, initial=self.current_bytes))
            self.peak_bytes = max(self.peak_bytes, max(running))
            self.current_bytes = running[-1]
            self.total_bytes += sum(change for change in changes if change > 0)

    def stats(self) -> dict:
        with self.lock:
            self._fold()
            return {
                "allocations": self.allocations, "frees": self.frees, "failures": self.failures,
                "current_bytes": self.current_bytes, "peak_bytes": self.peak_bytes,
                "total_bytes": self.total_bytes, "live": len(self._sizes),
                "mean_alloc_us": self.alloc_ns / self.allocations / 1e3 if self.allocations else 0.0,
                "max_alloc_us": self.max_alloc_ns / 1e3,
                "mean_free_us": self.free_ns / self.frees / 1e3 if self.frees else 0.0,
            }

    def reset_peak(self) -> None:
        with self.lock:
            self._fold()
            self.peak_bytes = self.current_bytes


class Refused(Exception):
    pass


class ScriptedUpstream(MemoryResource):
    """Hands out the lowest free pointer (so pointers come back), logs every call, and fails the
    next call when told to: allocate with Refused, deallocate with MemoryFreeError. Freeing a
    pointer it did not hand out fails too."""

    def __init__(self):
        self.live, self.calls, self.fail_next = set(), [], None

    def _failing(self, kind):
        if self.fail_next is kind:
            self.fail_next = None
            return True
        return False

    def allocate(self, nbytes, stream=None):
        self.calls.append(("allocate", nbytes, stream))
        if self._failing(BaseException):
            raise KeyboardInterrupt          # not an Exception: passes through uncounted
        if self._failing("allocate"):
            raise Refused(f"{nbytes} refused")
        pointer = next(p for p in itertools.count(0x1000, 0x100) if p not in self.live)
        self.live.add(pointer)
        return pointer

    def deallocate(self, pointer, nbytes=None, stream=None):
        self.calls.append(("deallocate", pointer, nbytes, stream))
        if self._failing(BaseException):
            raise KeyboardInterrupt
        if self._failing("deallocate") or pointer not in self.live:
            raise MemoryFreeError(f"0x{pointer:x} is not allocated")
        self.live.remove(pointer)

    def owns(self, pointer):
        return pointer in self.live


OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("allocate"), st.integers(0, 1 << 20),
              st.sampled_from([None, "allocate", BaseException]), st.sampled_from([None, 7])),
    st.tuples(st.just("free"), st.integers(0, 63),
              st.sampled_from([None, "deallocate", BaseException]), st.sampled_from([None, 7])),
    st.tuples(st.just("free_unknown"), st.integers(0, 3), st.just(None), st.just(None)),
    st.tuples(st.just("reset_peak"), st.just(0), st.just(None), st.just(None)),
), max_size=120)


def drive(adaptor, upstream, operations):
    """Runs `operations` through `adaptor`; returns what each call returned or raised."""
    held, outcomes = [], []
    for kind, value, fail, stream in operations:
        upstream.fail_next = fail
        try:
            if kind == "allocate":
                pointer = adaptor.allocate(value, stream)
                held.append(pointer)
                outcomes.append(pointer)
            elif kind == "free" and held:
                pointer = held[value % len(held)]
                adaptor.deallocate(pointer, stream=stream)
                held.remove(pointer)
                outcomes.append(None)
            elif kind == "free_unknown":
                adaptor.deallocate(0x10 + value)
                outcomes.append(None)
            elif kind == "reset_peak":
                adaptor.reset_peak()
                outcomes.append(None)
        except (Exception, KeyboardInterrupt) as error:
            outcomes.append((type(error), str(error)))
        upstream.fail_next = None
    return outcomes


def counts(adaptor):
    found = {key: value for key, value in adaptor.stats().items() if key not in LATENCIES}
    found["total_bytes"] -= getattr(adaptor, "restored", 0)
    return found


@given(OPERATIONS)
def test_the_counts_match_the_python_adaptor(operations):
    native_upstream, oracle_upstream = ScriptedUpstream(), ScriptedUpstream()
    native = StatisticsAdaptor(native_upstream)
    oracle = OracleStatisticsAdaptor(oracle_upstream)
    assert drive(native, native_upstream, operations) == drive(oracle, oracle_upstream, operations)
    assert native_upstream.calls == oracle_upstream.calls        # the same arguments passed up
    assert counts(native) == counts(oracle)
    assert native._sizes == oracle._sizes
    stats = native.stats()
    assert stats["max_alloc_us"] >= stats["mean_alloc_us"] >= 0 and stats["mean_free_us"] >= 0
    assert (native.allocations, native.peak_bytes) == (stats["allocations"], stats["peak_bytes"])


@pytest.fixture
def pool():
    allocator = CachingAllocator(SimBackend(SimConfig(memory=64 * MiB)))
    yield allocator
    allocator.close()


def test_threads_count_every_call_without_a_lock(pool):
    stats = StatisticsAdaptor(pool)
    threads, rounds, size = 4, 2000, 4096

    def work():
        for _ in range(rounds):
            stats.deallocate(stats.allocate(size))

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    s = stats.stats()
    assert (s["allocations"], s["frees"], s["failures"], s["live"]) == (8000, 8000, 0, 0)
    assert s["current_bytes"] == 0 and s["total_bytes"] == 8000 * size
    assert size <= s["peak_bytes"] <= threads * size


def test_errors_and_arguments(pool):
    stats = StatisticsAdaptor(pool)
    pointer = stats.allocate(nbytes=256, stream=None)
    stats.deallocate(pointer=pointer, nbytes=256, stream=None)
    with pytest.raises(MemoryFreeError):                # the upstream's own error
        stats.deallocate(pointer)
    with pytest.raises(TypeError):                       # a size the counts cannot hold
        stats.allocate(1.5)
    with pytest.raises(TypeError):
        stats.allocate()
    with pytest.raises(TypeError):
        stats.allocate(1, None, None)
    with pytest.raises(TypeError):
        stats.deallocate(pointer, size=3)
    with pytest.raises(TypeError):
        stats.allocate(1, nbytes=1)
    s = stats.stats()
    assert (s["allocations"], s["frees"], s["failures"], s["current_bytes"]) == (1, 1, 1, 0)
    with pytest.raises(AttributeError):
        stats.peak_bytes = 0                             # the counts are read-only
    assert stats.upstream is pool and isinstance(stats, MemoryResource)


def test_an_adaptor_in_a_cycle_is_collected(pool):
    stats = StatisticsAdaptor(pool)
    stats.me = stats
    gone = weakref.ref(stats)
    del stats
    gc.collect()
    assert gone() is None
