"""Run by tests/test_predictive_devices.py in a fresh interpreter, on the device named as the
first argument: a training-style loop (a batch replaced only after the next is made, 40
activations per step) with predictive pre-allocation on (or off, with an argument `off`).
With an argument `varying`, the batch and two thirds of the activations grow with a sequence
length that changes from step to step (16 steps, marked with `memory.step()`). With
`one-off`, the steps are marked and the ninth makes a 1.9 MiB temporary the others do not,
kept for two requests (`lent`: whether the plan's arena held it). Every block is filled with
its own byte value and checked before it is freed, so two live blocks sharing bytes would
show. Prints one JSON line: errors, hits, misses, hit rate, peak reserved, and the predictor's
note."""

import json
import os
import sys
import time

os.environ["NPUMEM_DEVICE"] = sys.argv[1]
os.environ["NPUMEM_ALLOC_CONF"] = f"predictive:{'off' not in sys.argv[2:]}"
VARYING = "varying" in sys.argv[2:]
ONE_OFF = "one-off" in sys.argv[2:]

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
lengths = [4, 6, 3, 6, 4, 3, 3, 6, 4, 6, 3, 4, 6, 4, 3, 6] if VARYING else [4] * 12
batch, batch_bytes, errors, lent = None, 0, 0, False
for step, length in enumerate(lengths):
    new_bytes = (1 << 18) * length
    new = memory.caching_allocator_alloc(new_bytes)
    fill(new, new_bytes, step % 251)
    if batch is not None:
        errors += not holds(batch, batch_bytes, (step - 1) % 251)
        memory.caching_allocator_delete(batch)
    batch, batch_bytes = new, new_bytes
    blocks = []
    temporary = None
    for i, base in enumerate(sizes):
        if ONE_OFF and step == 8 and i == 10:
            temporary = memory.caching_allocator_alloc(2000000)
            fill(temporary, 2000000, 254)
            block = memory.get_allocator()._allocated[temporary]
            lent = hasattr(block.segment, "arena")          # an arena block, not the pool's
        if temporary is not None and i == 12:
            errors += not holds(temporary, 2000000, 254)
            memory.caching_allocator_delete(temporary)
            temporary = None
        nbytes = base if i % 3 == 2 else base * length // 4
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
    if VARYING or ONE_OFF:
        memory.step()
memory.caching_allocator_delete(batch)
stats = memory.memory_stats()
predictor = memory.get_allocator().predictor
print(json.dumps({"errors": errors, "lent": lent, "hits": stats.get("prediction.hits", 0),
                  "hit_rate": stats.get("prediction.hit_rate", 0.0),
                  "peak_reserved": stats["reserved_bytes.all.peak"],
                  "note": predictor.note if predictor is not None else "off"}))
