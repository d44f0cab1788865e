"""Hypothesis state machine over the driver-level allocator of the simulated NPU.

Invariants after every step, including after failed calls: live allocations never overlap, every
allocation meets the size and alignment rules, page accounting equals a recount, and every byte
written reads back.
"""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

import npumem
from npumem import MallocPolicy, MemAttr, MemcpyKind as K
from npumem import errors as E
from npumem.device import SimBackend, SimConfig
from npumem.device.pages import PageAccounting
from npumem.units import MiB, align_up

MALLOCS = {"malloc": (npumem.malloc, 32), "malloc_align32": (npumem.malloc_align32, 0),
           "malloc_cached": (npumem.malloc_cached, 32), "dvpp_malloc": (npumem.dvpp_malloc, 32)}
sizes = st.one_of(st.integers(1, 4096), st.integers(4096, 3 * MiB), st.integers(3 * MiB, 12 * MiB))


class DriverAllocator(RuleBasedStateMachine):
    pointers = Bundle("pointers")

    def __init__(self):
        super().__init__()
        if npumem.is_initialized():
            npumem.finalize()
        npumem.init(backend=SimBackend(SimConfig(memory=32 * MiB, huge_memory=16 * MiB)))
        npumem.set_device(0)
        self.live = {}          # pointer -> (api, size, contents)

    def teardown(self):
        for pointer, (api, _, _) in list(self.live.items()):
            (npumem.dvpp_free if api == "dvpp_malloc" else npumem.free)(pointer)
        assert npumem.finalize() == []

    @rule(target=pointers, api=st.sampled_from(sorted(MALLOCS)), size=sizes,
          policy=st.sampled_from(list(MallocPolicy)))
    def allocate(self, api, size, policy):
        call, _ = MALLOCS[api]
        before = npumem.get_mem_info(MemAttr.HBM_MEM)
        try:
            pointer = call(size) if api == "dvpp_malloc" else call(size, policy)
        except E.MemoryAllocationError:
            assert npumem.get_mem_info(MemAttr.HBM_MEM) == before
            return None
        self.live[pointer] = (api, size, bytearray(size))
        npumem.memset(pointer, size, 0, size)
        return pointer

    @rule(pointer=consumes(pointers))
    def release(self, pointer):
        if pointer is None or pointer not in self.live:
            return
        api, _, _ = self.live.pop(pointer)
        (npumem.dvpp_free if api == "dvpp_malloc" else npumem.free)(pointer)

    @rule(pointer=pointers, data=st.data())
    def write(self, pointer, data):
        if pointer not in self.live:
            return
        _, size, contents = self.live[pointer]
        offset = data.draw(st.integers(0, size - 1))
        chunk = data.draw(st.binary(min_size=1, max_size=min(64, size - offset)))
        npumem.memcpy(pointer + offset, len(chunk), chunk, len(chunk), K.HOST_TO_DEVICE)
        contents[offset:offset + len(chunk)] = chunk

    @rule(pointer=pointers, overrun=st.integers(1, 100))
    def write_out_of_bounds(self, pointer, overrun):
        if pointer not in self.live:
            return
        size = self.live[pointer][1]
        try:
            npumem.memset(pointer + size - 1, overrun + 1, 0xEE, overrun + 1)
        except E.MemoryAccessError:
            return
        raise AssertionError("an out-of-bounds memset was not caught")

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def bad_free(self, data):
        pointer = data.draw(st.sampled_from(sorted(self.live)))
        try:
            npumem.free(pointer + data.draw(st.integers(1, 64)))
        except E.MemoryFreeError:
            return
        raise AssertionError("freeing an interior pointer was not caught")

    @invariant()
    def no_overlap_and_rules_hold(self):
        backend = npumem.RUNTIME.backend
        allocations = backend.live_allocations(0)
        assert {a.start for a in allocations} == set(self.live)
        for a in allocations:
            api, size, _ = self.live[a.start]
            assert a.size == size and a.start % (128 if api == "dvpp_malloc" else 64) == 0
            assert a.reserved == align_up(size, 32) + MALLOCS[api][1]
        spans = sorted((a.start, a.start + PageAccounting.cost(a.page_kind, a.reserved)) for a in allocations)
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))

    @invariant()
    def page_accounting_matches_a_recount(self):
        pages = npumem.RUNTIME.backend.devices[0].pages
        recount = {"huge": 0, "normal": 0}
        for a in npumem.RUNTIME.backend.live_allocations(0):
            recount[a.page_kind] += PageAccounting.cost(a.page_kind, a.reserved)
        assert pages.used == recount
        assert recount["huge"] <= 16 * MiB
        free, total = npumem.get_mem_info(MemAttr.HBM_MEM)
        assert free == total - sum(recount.values())

    @invariant()
    def contents_read_back(self):
        for pointer, (_, size, contents) in self.live.items():
            out = bytearray(size)
            npumem.memcpy(out, size, pointer, size, K.DEVICE_TO_HOST)
            assert out == contents


DriverAllocator.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestDriverAllocator = DriverAllocator.TestCase
