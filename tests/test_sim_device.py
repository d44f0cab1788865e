"""The simulated NPU itself: address ranges, lazy backing, page accounting, memory info."""

import resource

import pytest
from hypothesis import given, settings, strategies as st

import npumem
from npumem import MallocPolicy as P, MemAttr
from npumem.device import SimBackend, SimConfig
from npumem.device.address_space import ADDRESS_BASE, DEVICE_SPAN
from npumem.errors import InvalidParamError, MemoryAllocationError
from npumem.units import GiB, MiB

from .conftest import read_device, write_device


def test_default_config_is_one_device_of_32_gib(monkeypatch):
    for name in ("NPUMEM_SIM_DEVICES", "NPUMEM_SIM_MEMORY", "NPUMEM_SIM_HUGE_MEMORY", "NPUMEM_SIM_MEMORY_KIND"):
        monkeypatch.delenv(name, raising=False)
    config = SimConfig.from_env()
    assert (config.devices, config.memory, config.memory_kind) == (1, 32 * GiB, "hbm")


def test_config_from_environment(monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_DEVICES", "3")
    monkeypatch.setenv("NPUMEM_SIM_MEMORY", "16GiB")
    monkeypatch.setenv("NPUMEM_SIM_HUGE_MEMORY", "4GiB")
    npumem.init()
    assert npumem.get_device_count() == 3
    npumem.set_device(2)
    assert npumem.get_mem_info(MemAttr.HBM_MEM) == (16 * GiB, 16 * GiB)
    assert npumem.get_mem_info(MemAttr.HBM_MEM_HUGE) == (4 * GiB, 4 * GiB)


@pytest.mark.parametrize("name, value", [("NPUMEM_SIM_MEMORY", "lots"), ("NPUMEM_SIM_DEVICES", "x"),
                                         ("NPUMEM_SIM_DEVICES", "0"), ("NPUMEM_SIM_MEMORY_KIND", "sram")])
def test_bad_environment_is_a_clear_error(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidParamError) as info:
        npumem.init()
    assert value in str(info.value) or "must be" in str(info.value)
    assert not npumem.is_initialized()


def test_untouched_memory_costs_no_ram(rt):
    npumem.finalize()
    npumem.init(backend=SimBackend(SimConfig(memory=32 * GiB)))
    npumem.set_device(0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pointer = npumem.malloc(30 * GiB)              # more than this machine's RAM
    write_device(pointer + 20 * GiB, b"far away")  # touches one page
    assert read_device(pointer + 20 * GiB, 8) == b"far away"
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024
    npumem.free(pointer)


def test_each_device_has_its_own_address_range(rt):
    first = npumem.malloc(100)
    npumem.set_device(1)
    second = npumem.malloc(100)
    assert ADDRESS_BASE <= first < ADDRESS_BASE + DEVICE_SPAN
    assert ADDRESS_BASE + DEVICE_SPAN <= second < ADDRESS_BASE + 2 * DEVICE_SPAN
    assert npumem.RUNTIME.backend.device_of(second) == 1


def test_pointer_arithmetic_inside_an_allocation(rt):
    base = npumem.malloc(1000)
    write_device(base, bytes(range(250)) * 4)
    assert read_device(base + 300, 10) == bytes(range(50, 60))
    write_device(base + 990, b"0123456789")
    assert read_device(base + 985, 15) == bytes(range(235, 240)) + b"0123456789"


def _used(attr=MemAttr.HBM_MEM):
    free, total = npumem.get_mem_info(attr)
    return total - free


def _pages_used():
    return dict(npumem.RUNTIME.backend.devices[0].pages.used)


@pytest.mark.parametrize("size, policy, kind, pages", [
    (100, P.HUGE_FIRST, "normal", 4096),                      # <= 1 MiB: normal pages
    (1 * MiB - 32, P.HUGE_FIRST, "normal", 1 * MiB),
    (1 * MiB + 1, P.HUGE_FIRST, "huge", 2 * MiB),             # above: huge pages
    (5 * MiB, P.HUGE_FIRST_P2P, "huge", 6 * MiB),
    (100, P.HUGE_ONLY, "huge", 2 * MiB),
    (3 * MiB, P.NORMAL_ONLY, "normal", 3 * MiB + 4096),
    (3 * MiB, P.NORMAL_ONLY_P2P, "normal", 3 * MiB + 4096),
])
def test_policies_choose_page_kinds(rt, size, policy, kind, pages):
    pointer = npumem.malloc(size, policy)
    assert _pages_used() == {"huge": 0, "normal": 0, kind: pages}
    assert _used() == pages
    assert _used(MemAttr.HBM_MEM_NORMAL) == pages                # normal pages can use any memory
    assert _used(MemAttr.HBM_MEM_HUGE) == (pages if kind == "huge" else 0)
    npumem.free(pointer)
    assert _used() == 0 and _pages_used() == {"huge": 0, "normal": 0}


def test_huge_first_falls_back_to_normal_pages(rt):
    hog = npumem.malloc(125 * MiB, P.HUGE_ONLY)           # huge pages are capped at 128 MiB here
    assert npumem.get_mem_info(MemAttr.HBM_MEM_HUGE) == (2 * MiB, 128 * MiB)
    pointer = npumem.malloc(4 * MiB, P.HUGE_FIRST)
    assert _pages_used() == {"huge": 126 * MiB, "normal": 4 * MiB + 4096}
    with pytest.raises(MemoryAllocationError, match="HUGE_FIRST to fall back"):
        npumem.malloc(4 * MiB, P.HUGE_ONLY)
    npumem.free(pointer)
    npumem.free(hog)


def test_mem_info_for_ddr_devices():
    npumem.init(backend=SimBackend(SimConfig(memory=64 * MiB, memory_kind="ddr")))
    npumem.set_device(0)
    npumem.malloc(3 * MiB)                                 # two huge pages
    npumem.malloc(10_000)                                  # three normal pages
    assert npumem.get_mem_info(MemAttr.DDR_MEM) == (60 * MiB - 12288, 64 * MiB)
    assert npumem.get_mem_info(MemAttr.DDR_MEM_HUGE) == (58 * MiB, 64 * MiB)
    assert npumem.get_mem_info(MemAttr.DDR_MEM_NORMAL) == (60 * MiB - 12288, 64 * MiB)
    assert npumem.get_mem_info(MemAttr.HBM_MEM) == (0, 0)
    assert npumem.get_mem_info(MemAttr.HBM_MEM_HUGE) == (0, 0)


def test_addresses_are_never_reused(rt):
    seen = set()
    for _ in range(50):
        pointer = npumem.malloc(64)
        assert pointer not in seen
        seen.add(pointer)
        npumem.free(pointer)


def test_addresses_are_above_host_memory_and_exact_in_javascript():
    from npumem.device.address_space import MAX_DEVICES, AddressSpace

    last = AddressSpace(MAX_DEVICES - 1)
    assert ADDRESS_BASE >= 1 << 48 and last.end <= 2**53       # JS numbers are exact below 2**53
    assert float(last.end - 1) == last.end - 1


def test_exported_snapshots_hold_only_javascript_safe_addresses(rt):
    import npumem.memory as mem

    npumem.set_device(1)
    kept = [mem.caching_allocator_alloc(size) for size in (100, 5 << 20, 64)]
    mem.caching_allocator_delete(kept.pop(1))
    snapshot = mem.memory_snapshot()
    addresses = [s["address"] for s in snapshot["segments"]] + \
        [b["address"] for s in snapshot["segments"] for b in s["blocks"]]
    assert addresses and all(0 < a < 2**53 for a in addresses)
    for pointer in kept:
        mem.caching_allocator_delete(pointer)


def test_freed_addresses_come_back_only_when_the_slice_is_used_up():
    from npumem.device.address_space import AddressSpace

    space = AddressSpace(0, span=1 << 20)
    first = space.claim(256 << 10, 4096, "t")
    second = space.claim(256 << 10, 4096, "t")
    space.release(first)
    third = space.claim(256 << 10, 4096, "t")
    assert third > second                       # a stale `first` still points at freed memory
    fourth = space.claim(256 << 10, 4096, "t")  # the slice is now full
    assert fourth > third
    space.release(second)
    reused = space.claim(512 << 10, 4096, "t")  # goes round: first and second, freed, are one gap
    assert reused == first
    with pytest.raises(npumem.errors.MemoryAllocationError, match="no 4096-byte range"):
        space.claim(4096, 4096, "t")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300_000), st.sampled_from([1, 64, 4096]), st.booleans()),
                min_size=1, max_size=60))
def test_claims_never_overlap_live_ones(steps):
    from npumem.device.address_space import AddressSpace

    space = AddressSpace(2, span=1 << 21)
    live: dict[int, int] = {}
    for nbytes, align, release_one in steps:
        try:
            start = space.claim(nbytes, align, "t")
        except npumem.errors.MemoryAllocationError:     # refused only if no gap can hold it
            edges = [space.base] + [e for s, n in sorted(live.items()) for e in (s, s + n)] + [space.end]
            gaps = zip(edges[::2], edges[1::2])
            assert all(-(-low // align) * align + nbytes > high for low, high in gaps)
            continue
        assert start % align == 0 and space.base <= start and start + nbytes <= space.end
        assert all(start + nbytes <= s or s + n <= start for s, n in live.items())
        live[start] = nbytes
        if release_one:
            victim = min(live)
            space.release(victim)
            del live[victim]
