"""Each adaptor's own concern: statistics, tracking with stacks, RMM CSV logging, limits."""

import csv
import io

import pytest

from npumem.alloc.adaptors import LimitingAdaptor, LoggingAdaptor, StatisticsAdaptor, TrackingAdaptor
from npumem.alloc.caching_allocator import CachingAllocator, OutOfMemoryError
from npumem.alloc.resource import MemoryResource
from npumem.device import SimBackend, SimConfig
from npumem.errors import MemoryFreeError
from npumem.units import MiB


@pytest.fixture
def pool():
    allocator = CachingAllocator(SimBackend(SimConfig(memory=64 * MiB)))
    yield allocator
    allocator.close()


def test_statistics(pool):
    stats = StatisticsAdaptor(pool)
    a, b = stats.allocate(100), stats.allocate(300)
    stats.deallocate(a)
    with pytest.raises(OutOfMemoryError):
        stats.allocate(1 << 40)
    s = stats.stats()
    assert (s["allocations"], s["frees"], s["failures"], s["live"]) == (2, 1, 1, 1)
    assert (s["current_bytes"], s["peak_bytes"], s["total_bytes"]) == (300, 400, 400)
    assert s["mean_alloc_us"] > 0 and s["max_alloc_us"] >= s["mean_alloc_us"]
    stats.reset_peak()
    assert stats.stats()["peak_bytes"] == 300
    stats.deallocate(b)


def _allocate_here(resource):
    return resource.allocate(512)      # the line the tracker must name


def test_tracking_names_the_allocation_site(pool):
    tracker = TrackingAdaptor(pool, stacks=True)
    tracker.tag = "activations"
    pointer = _allocate_here(tracker)
    (record,) = tracker.live()
    assert record.pointer == pointer and record.size == 512 and record.tag == "activations"
    assert record.frames[0][0] == __file__ and record.frames[0][2] == "_allocate_here"
    report = tracker.report()
    assert "1 live allocation(s)" in report and "_allocate_here" in report and "[activations]" in report
    tracker.deallocate(pointer)
    assert tracker.live() == []
    plain = TrackingAdaptor(pool)
    plain.deallocate(plain.allocate(64))


def test_logging_writes_rmm_csv(pool, tmp_path):
    path = tmp_path / "log.csv"
    logger = LoggingAdaptor(pool, str(path))
    pointer = logger.allocate(1000, stream=7)
    logger.deallocate(pointer)
    with pytest.raises(OutOfMemoryError):
        logger.allocate(1 << 40)
    logger.close()
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
    assert [r[2] for r in rows[1:]] == ["allocate", "free", "allocate failure"]
    assert rows[1][3] == f"0x{pointer:x}" and rows[1][4] == "1000" and rows[1][5] == "7"
    assert rows[2][4] == "1000"


def test_limiting(pool):
    limited = LimitingAdaptor(pool, 10_000)
    a = limited.allocate(6000)
    with pytest.raises(OutOfMemoryError, match="5.86 KiB of the 9.77 KiB limit is outstanding"):
        limited.allocate(5000)
    b = limited.allocate(4000)
    limited.deallocate(a)
    limited.deallocate(b)
    assert limited.outstanding == 0
    with pytest.raises(MemoryFreeError):
        limited.deallocate(a)


def test_adaptors_compose_and_expose_upstream(pool):
    stack = LoggingAdaptor(StatisticsAdaptor(TrackingAdaptor(pool)), io.StringIO())
    assert stack.upstream.upstream.upstream is pool
    pointer = stack.allocate(100)
    assert stack.owns(pointer)
    stack.deallocate(pointer)


class _ReusingUpstream(MemoryResource):
    """Hands out one pointer; while freeing it, runs `during_free` — as if another thread got
    the same pointer back from the pool before the freeing thread returned."""

    def __init__(self):
        self.live, self.during_free = set(), None

    def allocate(self, nbytes, stream=None):
        assert 0x1000 not in self.live
        self.live.add(0x1000)
        return 0x1000

    def deallocate(self, pointer, nbytes=None, stream=None):
        if pointer not in self.live:
            raise MemoryFreeError(f"0x{pointer:x} is not allocated")
        self.live.remove(pointer)
        hook, self.during_free = self.during_free, None
        if hook is not None:
            hook()

    def owns(self, pointer):
        return pointer in self.live


@pytest.mark.parametrize("make", [StatisticsAdaptor, TrackingAdaptor,
                                  lambda up: LoggingAdaptor(up, io.StringIO()),
                                  lambda up: LimitingAdaptor(up, 1 << 20)])
def test_a_pointer_reused_while_it_is_being_freed_keeps_its_new_owner(make):
    upstream = _ReusingUpstream()
    adaptor = make(upstream)
    pointer = adaptor.allocate(100)
    upstream.during_free = lambda: adaptor.allocate(300)     # same pointer, new size
    adaptor.deallocate(pointer)
    adaptor.deallocate(pointer)                               # the second owner's free works
    if isinstance(adaptor, StatisticsAdaptor):
        stats = adaptor.stats()
        assert (stats["current_bytes"], stats["peak_bytes"], stats["live"]) == (0, 300, 0)
    if isinstance(adaptor, TrackingAdaptor):
        assert adaptor.live() == []
    if isinstance(adaptor, LimitingAdaptor):
        assert adaptor.outstanding == 0
