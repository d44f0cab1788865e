"""Run by tests/test_predictive_devices.py in a fresh interpreter, on the device named as the
first argument: a training-style loop (a batch replaced only after the next is made, 40
activations per step) with predictive pre-allocation on (or off, with a second argument
`off`). Every block is filled with its own
byte value and checked before it is freed, so two live blocks sharing bytes would show.
Prints one JSON line: errors, hits, misses, hit rate, peak reserved, and the predictor's note."""

import json
import os
import sys
import time

os.environ["NPUMEM_DEVICE"] = sys.argv[1]
os.environ["NPUMEM_ALLOC_CONF"] = f"predictive:{sys.argv[2:3] != ['off']}"

import numpy as np  # noqa: E402

import npumem  # noqa: E402
from npumem import memory  # noqa: E402
from npumem.runtime.control import get_backend  # noqa: E402

npumem.init()
backend = get_backend()


def view(pointer: int, nbytes: int):
    return backend.kernel_view(backend.resolve(pointer, nbytes, "check"), "check")


def fill(pointer: int, nbytes: int, value: int) -> None:
    target = view(pointer, nbytes)
    if hasattr(target, "fill_"):
        target.fill_(value)
    else:
        target[...] = value


def holds(pointer: int, nbytes: int, value: int) -> bool:
    target = view(pointer, nbytes)
    if hasattr(target, "fill_"):
        return bool((target == value).all())
    return bool(np.all(np.asarray(target) == value))


sizes = [(i % 7 + 1) * 65536 + i * 512 for i in range(40)]
batch, errors = None, 0
for step in range(12):
    new = memory.caching_allocator_alloc(1 << 20)
    fill(new, 1 << 20, step % 251)
    if batch is not None:
        errors += not holds(batch, 1 << 20, (step - 1) % 251)
        memory.caching_allocator_delete(batch)
    batch = new
    blocks = []
    for i, nbytes in enumerate(sizes):
        pointer = memory.caching_allocator_alloc(nbytes)
        value = (step * 40 + i) % 253
        fill(pointer, nbytes, value)
        blocks.append((pointer, nbytes, value))
    for pointer, nbytes, value in reversed(blocks):
        errors += not holds(pointer, nbytes, value)
        memory.caching_allocator_delete(pointer)
    predictor = memory.get_allocator().predictor     # the step's work would cover planning:
    deadline = time.monotonic() + 10                 # here, wait for the planner thread
    while predictor is not None and predictor.planning and time.monotonic() < deadline:
        time.sleep(0.001)
memory.caching_allocator_delete(batch)
stats = memory.memory_stats()
predictor = memory.get_allocator().predictor
print(json.dumps({"errors": errors, "hits": stats.get("prediction.hits", 0),
                  "hit_rate": stats.get("prediction.hit_rate", 0.0),
                  "peak_reserved": stats["reserved_bytes.all.peak"],
                  "note": predictor.note if predictor is not None else "off"}))
