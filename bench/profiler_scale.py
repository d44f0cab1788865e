"""The profiler at scale: a sampler tick over a million live blocks, and the outputs of a
million events.

    python bench/profiler_scale.py [--blocks 1000000] [--events 1000000]

1. Sampling: `--blocks` live 512-byte blocks in the simulated NPU's pool (expandable and
   segment modes). A tick takes the pool's fragmentation; it used to walk every block under
   the pool lock (`fragmentation()`), it now reads the free lists (`fragmentation_ratio()`).
   Both are timed and printed with their ratio; they must agree.
2. Outputs: a profile of `--events` events (alloc/free pairs) written to a folder; the peak
   resident memory while writing, above what the recording itself holds (Linux's VmHWM,
   reset before the writing starts).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time

import npumem
import npumem.memory as mem
from npumem.alloc.caching_allocator import CachingAllocator
from npumem.alloc.settings import AllocatorSettings
from npumem.device import SimBackend, SimConfig
from npumem.profile.session import ProfileSession
from npumem.units import GiB, format_size


def median_seconds(work, rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def sampling(blocks: int) -> None:
    print(f"sampler tick with {blocks:,} live 512 B blocks (median of 3):")
    print(f"  {'mode':<11} {'walk (s)':>10} {'free lists (s)':>15} {'ratio':>9}  fragmentation")
    for name, expandable in (("expandable", True), ("segments", False)):
        backend = SimBackend(SimConfig(memory=max(4 * GiB, blocks * 2048)))
        pool = CachingAllocator(backend, 0, AllocatorSettings(expandable_segments=expandable))
        pointers = [pool.allocate(512) for _ in range(blocks)]
        for pointer in pointers[::3]:           # holes, so there is fragmentation to measure
            pool.deallocate(pointer)
        walk = median_seconds(pool.fragmentation)
        quick = median_seconds(pool.fragmentation_ratio)
        full, fast = pool.fragmentation()["ratio"], pool.fragmentation_ratio()
        assert abs(full - fast) < 1e-12, (full, fast)
        print(f"  {name:<11} {walk:>10.4f} {quick:>15.6f} {walk / quick:>8.0f}x  {fast:.4f}")
        pool.close()


def _vm_hwm() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def outputs(events: int) -> None:
    npumem.init()
    npumem.set_device(0)
    session = ProfileSession(max_entries=events).start()
    alloc, free = mem.caching_allocator_alloc, mem.caching_allocator_delete
    for index in range(events // 2):
        free(alloc(512 + (index % 64) * 512))
    session.stop()
    folder = tempfile.mkdtemp(prefix="npumem-scale-")
    reset = _reset_hwm()
    before = _vm_hwm()
    start = time.perf_counter()
    problems = session.write(__import__("pathlib").Path(folder), "scale")
    seconds = time.perf_counter() - start
    peak = _vm_hwm()
    sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
    shutil.rmtree(folder)
    print(f"outputs of {events:,} events: written in {seconds:.1f} s; " +
          (f"peak RSS while writing {format_size(peak)}, {format_size(peak - before)} above the "
           f"recording's {format_size(before)}" if reset else "(no VmHWM reset on this kernel)"))
    print("  " + ", ".join(f"{name} {format_size(size)}" for name, size in sizes.items()))
    if problems:
        print("  problems:", problems)
    npumem.reset_device(0)
    npumem.finalize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    sampling(args.blocks)
    outputs(args.events)


if __name__ == "__main__":
    main()
