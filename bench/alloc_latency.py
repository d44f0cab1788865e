"""Cache-hit allocate+deallocate pairs: npumem's pool against its peers, in one run.

    python bench/alloc_latency.py [--device sim|torch:cpu|torch:cuda] [--pairs 100000] [--json]

Mixed sizes from 512 B to 16 MiB, the pools warmed so every request is a cache hit. Times the
pool (expandable and segment modes), the public API (npumem.memory.caching_allocator_alloc +
caching_allocator_delete, on a runtime over the same kind of device), the pool under the
statistics adaptor, the tracking adaptor with Python stacks (cost per event), and the peers on
the same device: torch.empty(n, dtype=torch.uint8) + del (PyTorch's caching allocator on cuda),
and on cuda CuPy's MemoryPool when CuPy is installed. Every path is timed the same way: a plain
loop of calls over a chunk of the requests, with no timer or lambda per call (a per-call timer
and a lambda add about 0.8 us to torch's side); the paths take turns chunk by chunk, so drift in
a shared machine's speed hits them all alike. Reports the median over chunks of the time per
pair (the typical call) and the mean (which includes work amortized over many calls, such as
a garbage collection). Targets (issue 42): pool <= 1.5x torch, public API <= 2x
torch; statistics adaptor <= +30%.

Predictive hits (predictive:True) are timed on a repeated step of those sizes, against the
plain pool on the same steps, request by request in turn. So is a program that never repeats
(random sizes and lifetimes, twice predictive.QUIET requests): the pool with prediction learns
for QUIET requests, serves no plan, and pauses learning (bench/predictive_cost.py times whole
stretches, pauses and learning together).

The pool sanitizer is global, so its cost is timed apart: rounds of the pool's pairs take turns
with it off, at the free level (NPUMEM_SANITIZE=free; target <= +20%) and at the full level
(NPUMEM_SANITIZE=1), and the ratios of the medians to off are printed. The free level does its
work when a tensor is made and when memory is accessed, not per pair, so a tensor's
npumem.empty + del on a runtime is timed at each level too.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import npumem
from npumem.alloc.adaptors import StatisticsAdaptor, TrackingAdaptor
from npumem.alloc.caching_allocator import CachingAllocator
from npumem.alloc.predictive import QUIET
from npumem.alloc.settings import AllocatorSettings
from npumem.device import SimBackend, SimConfig
from npumem.device.torch_backend import TorchBackend
from npumem.errors import AclError
from npumem.units import GiB


def sizes(count: int) -> list[int]:
    rng = np.random.default_rng(0)
    return [int(s) for s in np.exp(rng.uniform(np.log(512), np.log(16 << 20), count))]


def pair_loop(allocate, deallocate):
    """A loop of allocate+deallocate pairs over a list of sizes, calling the two directly."""
    def loop(requests: list[int]) -> None:
        for n in requests:
            deallocate(allocate(n))
    return loop


CHUNK = 500        # pairs timed as one loop: long enough that the clock's cost vanishes


def interleaved_pairs(paths: dict, requests: list[int]) -> dict[str, tuple[float, float]]:
    """{label: (median, mean)} microseconds per allocate+deallocate, for {label: loop}: each
    loop runs a chunk of the requests, the paths taking turns chunk by chunk."""
    for loop in paths.values():
        loop(list(set(requests)))                 # warm the caches: every timed request is a hit
    clock = time.perf_counter_ns
    samples = {label: [] for label in paths}
    for i in range(0, len(requests), CHUNK):
        chunk = requests[i:i + CHUNK]
        for label, loop in paths.items():
            start = clock()
            loop(chunk)
            samples[label].append((clock() - start) / len(chunk))
    return {label: (statistics.median(times) / 1e3, statistics.fmean(times) / 1e3)
            for label, times in samples.items()}


LEVELS = ("off", "free", "full")


def _set_level(level: str) -> None:
    from npumem.device import sanitizer

    if level == "off":
        sanitizer.disable()
    else:
        sanitizer.enable(level)


def sanitizer_cost(pool, requests: list[int], rounds: int = 9) -> dict[str, float]:
    """{level: median us per pair} with the pool sanitizer off, free and full, rounds taking
    turns."""
    from npumem.device import sanitizer

    was = sanitizer.SANITIZER.level
    medians = {level: [] for level in LEVELS}
    for round_number in range(rounds):
        level = LEVELS[round_number % len(LEVELS)]
        _set_level(level)
        medians[level].append(interleaved_pairs({"pool": pair_loop(pool.allocate, pool.deallocate)},
                                                requests)["pool"][0])
    _set_level(was)
    return {level: statistics.median(values) for level, values in medians.items()}


def tensor_sanitizer_cost(backend, count: int = 2000, rounds: int = 9) -> dict[str, tuple]:
    """{level: (median us per npumem.empty + del, per 64-element Add)} on a runtime over
    `backend` (tensors are cache hits; the Add is phase 1 + a pool workspace + launch, inline on
    an idle stream; the runtime is finalized after), rounds taking turns between the levels:
    the free level keeps a record per tensor and checks each launch's tensors again."""
    import npumem
    from npumem.device import sanitizer
    from npumem.ops import aclnn

    was = sanitizer.SANITIZER.level
    npumem.init(backend=backend)
    npumem.set_device(0)
    shapes = [(n // 4,) for n in sizes(count) if n < (1 << 20)]
    for shape in shapes:
        del_me = npumem.empty(shape, "float32")
        del del_me
    x = npumem.from_numpy(np.ones(64, dtype=np.float32))
    out = npumem.empty((64,), "float32")

    def add() -> None:
        aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(x, x, 1.0, out))

    clock = time.perf_counter_ns
    medians = {level: ([], []) for level in LEVELS}
    for round_number in range(rounds):
        level = LEVELS[round_number % len(LEVELS)]
        _set_level(level)
        made, added = [], []
        for shape in shapes:
            start = clock()
            tensor = npumem.empty(shape, "float32")
            del tensor
            made.append(clock() - start)
        for _ in shapes:
            start = clock()
            add()
            added.append(clock() - start)
        medians[level][0].append(statistics.median(made) / 1e3)
        medians[level][1].append(statistics.median(added) / 1e3)
    npumem.synchronize_device()
    x = out = None                         # given back before the runtime ends
    _set_level(was)
    npumem.finalize()
    return {level: tuple(statistics.median(values) for values in pair)
            for level, pair in medians.items()}


def predictive_hits(backend, requests: list[int], rounds: int = 5) -> tuple[float, float, float]:
    """(median us per pair: the pool's cache hit, a predictive hit, share of predictive hits).

    The step is the request list (each request allocated and freed), marked with
    npumem.memory.step()'s pool call; after two steps the plan serves it. Both pools then run
    the same steps, request by request in turn."""
    pool = CachingAllocator(backend, 0)
    predicted = CachingAllocator(backend, 0, AllocatorSettings(predictive=True))
    predicted.predictor.background = False
    for _ in range(3):
        for n in requests:
            pool.deallocate(pool.allocate(n))
            predicted.deallocate(predicted.allocate(n))
        predicted.mark_step()
    hits_before = predicted.predictor.hits
    clock = time.perf_counter_ns
    samples = {"pool": [], "predictive": []}
    for _ in range(rounds):
        for n in requests:
            for label, target in (("pool", pool), ("predictive", predicted)):
                start = clock()
                target.deallocate(target.allocate(n))
                samples[label].append(clock() - start)
        predicted.mark_step()
    share = (predicted.predictor.hits - hits_before) / (rounds * len(requests))
    pool.close()
    predicted.close()
    return (statistics.median(samples["pool"]) / 1e3,
            statistics.median(samples["predictive"]) / 1e3, share)


def predictive_unrepeated(backend) -> tuple[float, float, float]:
    """(median us per request: the plain pool, the pool with prediction while it learns, and
    while it pauses) on a stream that never repeats: each request allocates a random size and
    may free a random live block."""
    rng = np.random.default_rng(1)
    count = 2 * QUIET
    requested = np.exp(rng.uniform(np.log(512), np.log(4 << 20), count)).astype(int).tolist()
    picks = rng.random(count).tolist()
    targets = {"pool": CachingAllocator(backend, 0),
               "predictive": CachingAllocator(backend, 0, AllocatorSettings(predictive=True))}
    live = {label: [] for label in targets}
    samples = {"pool": [], "learning": [], "paused": []}
    clock = time.perf_counter_ns
    for index, (n, pick) in enumerate(zip(requested, picks)):
        for label, target in targets.items():
            blocks = live[label]
            start = clock()
            if len(blocks) > 48 or (blocks and pick < 0.5):
                target.deallocate(blocks.pop(int(pick * 997) % len(blocks)))
            blocks.append(target.allocate(n))
            took = clock() - start
            phase = label if label == "pool" else "learning" if index < QUIET else "paused"
            samples[phase].append(took)
    for label, target in targets.items():
        for pointer in live[label]:
            target.deallocate(pointer)
        target.close()
    return tuple(statistics.median(samples[label]) / 1e3 for label in ("pool", "learning", "paused"))


def peers(device: str) -> dict:
    """{label: loop} of the other allocators on `device` that are installed."""
    found = {}
    try:
        import torch
    except ImportError:
        return found
    empty, uint8 = torch.empty, torch.uint8

    def torch_cpu(requests: list[int]) -> None:
        for n in requests:
            tensor = empty(n, dtype=uint8)
            del tensor

    def torch_cuda(requests: list[int]) -> None:
        for n in requests:
            tensor = empty(n, dtype=uint8, device="cuda")
            del tensor

    found["torch_empty_del"] = torch_cuda if device == "torch:cuda" else torch_cpu
    if device == "torch:cuda":
        try:
            import cupy
        except ImportError:
            return found
        malloc = cupy.cuda.MemoryPool().malloc

        def cupy_pool(requests: list[int]) -> None:
            for n in requests:
                pointer = malloc(n)            # back to the pool when dropped
                del pointer

        found["cupy_memory_pool"] = cupy_pool
    return found


def public_api(backend) -> dict:
    """{"public_api": loop} over npumem.memory's pool on a runtime started on `backend`
    (finalize it after)."""
    import npumem
    import npumem.memory as memory

    npumem.init(backend=backend)
    npumem.set_device(0)
    return {"public_api": pair_loop(memory.caching_allocator_alloc,
                                    memory.caching_allocator_delete)}


def machine(device: str) -> str:
    text = f"{platform.machine()} python {platform.python_version()}"
    if device == "torch:cuda":
        import torch
        text += f", {torch.cuda.get_device_name()}, torch {torch.__version__}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="sim", choices=["sim", "torch:cpu", "torch:cuda"])
    parser.add_argument("--pairs", type=int, default=100000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    def make_backend():
        if args.device == "sim":
            return SimBackend(SimConfig(memory=16 * GiB))
        return TorchBackend(args.device.split(":")[1], memory=16 * GiB)

    try:
        backend = make_backend()
    except AclError as exc:
        parser.error(exc.message)
    pool = CachingAllocator(backend, 0)
    segments = CachingAllocator(backend, 0, AllocatorSettings(expandable_segments=False))
    stats, tracked = StatisticsAdaptor(pool), TrackingAdaptor(pool, stacks=True)
    paths = {"pool": pair_loop(pool.allocate, pool.deallocate),
             "pool_segments": pair_loop(segments.allocate, segments.deallocate),
             "pool_with_statistics": pair_loop(stats.allocate, stats.deallocate),
             "pool_with_stacks": pair_loop(tracked.allocate, tracked.deallocate)}
    paths.update(public_api(make_backend()))
    paths.update(peers(args.device))
    timed = interleaved_pairs(paths, sizes(args.pairs))
    npumem.finalize()                                  # the public API's runtime
    # the rest times per call, pool against pool; sized as at the former 20,000 pairs
    pairs = min(args.pairs, 20000)
    sanitized = sanitizer_cost(pool, sizes(pairs // 4))
    tensors = tensor_sanitizer_cost(make_backend(), max(pairs // 10, 100))   # finalized
    pool_hit, predictive_hit, predictive_share = predictive_hits(backend, sizes(pairs // 5))
    unrepeated = predictive_unrepeated(backend)
    pool.close()
    segments.close()

    results = {"machine": machine(args.device), "device": args.device, "pairs": args.pairs}
    for label, (median, mean) in timed.items():
        results[f"{label}_us"], results[f"{label}_mean_us"] = median, mean
    results["statistics_overhead"] = results["pool_with_statistics_us"] / results["pool_us"] - 1
    results["stack_capture_us_per_event"] = results["pool_with_stacks_us"] - results["pool_us"]
    plain = sanitized["off"]
    results["sanitizer_off_us"], results["sanitizer_on_us"] = plain, sanitized["full"]
    results["sanitizer_free_us"] = sanitized["free"]
    results["sanitizer_overhead"] = sanitized["full"] / plain - 1
    results["sanitizer_free_overhead"] = sanitized["free"] / plain - 1
    for level in LEVELS:
        results[f"tensor_{level}_us"], results[f"add_op_{level}_us"] = tensors[level]
    results["predictive_pool_hit_us"], results["predictive_hit_us"] = pool_hit, predictive_hit
    results["predictive_hit_share"] = predictive_share
    results["predictive_over_pool"] = predictive_hit / pool_hit
    (results["unrepeated_pool_us"], results["unrepeated_learning_us"],
     results["unrepeated_paused_us"]) = unrepeated
    if "torch_empty_del" in timed:
        for label in ("pool", "public_api"):
            results[f"{label}_over_torch"] = results[f"{label}_us"] / results["torch_empty_del_us"]
            results[f"{label}_over_torch_mean"] = \
                results[f"{label}_mean_us"] / results["torch_empty_del_mean_us"]
    if "cupy_memory_pool" in timed:
        results["pool_over_cupy"] = results["pool_us"] / results["cupy_memory_pool_us"]

    if args.json:
        print(json.dumps(results))
        return
    print(f"{results['machine']}; {args.pairs} cache-hit pairs, sizes 512 B..16 MiB, "
          f"loops of {CHUNK} pairs")
    print(f"  {'us per allocate+free':<26} {'median':>7} {'mean':>7}")
    for label, (median, mean) in timed.items():
        print(f"  {label:<26} {median:7.2f} {mean:7.2f}")
    print(f"  statistics adaptor overhead: {results['statistics_overhead']:+.0%}")
    print(f"  stack capture: {results['stack_capture_us_per_event']:.2f} us per allocation")
    print(f"  pool sanitizer: {plain:.2f} -> {sanitized['full']:.2f} us per pair "
          f"({sanitized['full'] / plain:.2f}x, {results['sanitizer_overhead']:+.0%}; "
          f"NPUMEM_SANITIZE=1); free level {sanitized['free']:.2f} "
          f"({sanitized['free'] / plain:.2f}x, {results['sanitizer_free_overhead']:+.0%}; "
          "NPUMEM_SANITIZE=free, target <= +20%)")
    for index, what in enumerate(("npumem.empty + del", "a 64-element Add")):
        off = tensors["off"][index]
        print(f"  pool sanitizer, {what}: off {off:.2f}, " + ", ".join(
              f"{level} {tensors[level][index]:.2f} ({tensors[level][index] / off:.2f}x)"
              for level in LEVELS[1:]) + " us")
    print(f"  predictive hit: {predictive_hit:.2f} us per pair against the pool's {pool_hit:.2f} "
          f"({results['predictive_over_pool']:.2f}x; {predictive_share:.1%} of requests hit)")
    print(f"  predictive, a stream that never repeats: {unrepeated[1]:.2f} us per request while "
          f"learning, {unrepeated[2]:.2f} once paused, against the pool's {unrepeated[0]:.2f}")
    if "pool_over_torch" in results:
        for label, target in (("pool", 1.5), ("public_api", 2)):
            print(f"  {label} / torch: {results[f'{label}_over_torch']:.2f}x median (target <= "
                  f"{target}x), {results[f'{label}_over_torch_mean']:.2f}x mean")
    if "pool_over_cupy" in results:
        print(f"  pool / CuPy MemoryPool: {results['pool_over_cupy']:.2f}x median")


if __name__ == "__main__":
    main()
