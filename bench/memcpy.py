"""Copy bandwidth of the simulated NPU against numpy.copyto of the same bytes, in one run.

    python bench/memcpy.py [--size-mib 64] [--repeat 15] [--json]

For each direction (H2D, D2H, D2D), sync `memcpy` and `memcpy_async` + `synchronize_stream`
are timed against `numpy.copyto` between two host arrays of the same size; the ratio is
npumem bandwidth / numpy bandwidth (target >= 0.7). Also reports the per-call overhead of a 4 KiB
copy and of malloc + free, in microseconds. Medians over --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import npumem
from npumem import MemcpyKind as K


def median_seconds(function, repeat: int) -> float:
    function()                                   # warm up: first touch of the pages
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    nbytes = args.size_mib << 20

    npumem.init()
    npumem.set_device(0)
    stream = npumem.create_stream()
    host_a = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    host_b = np.empty_like(host_a)
    pinned = npumem.malloc_host(nbytes)
    npumem.memcpy(pinned, nbytes, host_a, nbytes, K.HOST_TO_HOST)
    dev_a, dev_b = npumem.malloc(nbytes), npumem.malloc(nbytes)
    npumem.memcpy(dev_a, nbytes, host_a, nbytes, K.HOST_TO_DEVICE)

    numpy_s = median_seconds(lambda: np.copyto(host_b, host_a), args.repeat)
    cases = {
        "H2D sync": lambda: npumem.memcpy(dev_b, nbytes, host_a, nbytes, K.HOST_TO_DEVICE),
        "D2H sync": lambda: npumem.memcpy(host_b, nbytes, dev_a, nbytes, K.DEVICE_TO_HOST),
        "D2D sync": lambda: npumem.memcpy(dev_b, nbytes, dev_a, nbytes, K.DEVICE_TO_DEVICE),
    }
    for name, kind, dst, src in (("H2D async", K.HOST_TO_DEVICE, dev_b, pinned),
                                 ("D2H async", K.DEVICE_TO_HOST, pinned, dev_a),
                                 ("D2D async", K.DEVICE_TO_DEVICE, dev_b, dev_a)):
        cases[name] = (lambda dst=dst, src=src, kind=kind: (
            npumem.memcpy_async(dst, nbytes, src, nbytes, kind, stream),
            npumem.synchronize_stream(stream)))
    results = {"machine": f"{platform.machine()} {platform.processor() or ''} "
                          f"python {platform.python_version()} numpy {np.__version__}".strip(),
               "bytes": nbytes, "numpy_copyto_gbps": nbytes / numpy_s / 1e9, "copies": {}}
    for name, case in cases.items():
        seconds = median_seconds(case, args.repeat)
        results["copies"][name] = {"gbps": nbytes / seconds / 1e9, "ratio_vs_numpy": numpy_s / seconds}

    small = np.zeros(4096, dtype=np.uint8)
    small_dev = npumem.malloc(4096)
    calls = 20000
    start = time.perf_counter()
    for _ in range(calls):
        npumem.memcpy(small_dev, 4096, small, 4096, K.HOST_TO_DEVICE)
    results["copy_4k_us"] = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for _ in range(calls):
        np.copyto(small, small)
    results["numpy_copyto_4k_us"] = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for _ in range(calls):
        npumem.free(npumem.malloc(4096))
    results["malloc_free_us"] = (time.perf_counter() - start) / calls * 1e6

    npumem.free(small_dev)
    npumem.free(dev_a)
    npumem.free(dev_b)
    npumem.free_host(pinned)
    npumem.destroy_stream(stream)
    npumem.reset_device(0)
    npumem.finalize()

    if args.json:
        print(json.dumps(results))
        return
    print(f"{results['machine']}; {args.size_mib} MiB copies, median of {args.repeat}")
    print(f"numpy.copyto: {results['numpy_copyto_gbps']:.2f} GB/s")
    for name, row in results["copies"].items():
        print(f"{name:<10} {row['gbps']:7.2f} GB/s   {row['ratio_vs_numpy']:.2f}x numpy")
    print(f"4 KiB memcpy H2D: {results['copy_4k_us']:.2f} us per call "
          f"(numpy.copyto 4 KiB: {results['numpy_copyto_4k_us']:.2f} us)")
    print(f"malloc(4096) + free: {results['malloc_free_us']:.2f} us per pair")


if __name__ == "__main__":
    main()
