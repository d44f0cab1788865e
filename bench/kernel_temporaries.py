"""Measure, on a real GPU, the memory each PyTorch operator allocates beyond its outputs: the
workspaces and scratch buffers that `npumem estimate` adds by rule (cuDNN convolution
workspaces, cuBLAS workspaces, reduction scratch, attention and embedding temporaries).

    python bench/kernel_temporaries.py OUT.jsonl [NAME ...]

Runs each workload of bench/estimate_workloads.py on the GPU under a dispatch mode that notes
the allocator's cumulative allocation and free counts around every operator, with the
allocator's history on. Afterwards each operator's allocations are read from the history:
those freed before the operator returned are its temporaries; those kept beyond its outputs'
storages are state it made (a cuBLAS workspace). One JSON line per operator call that has
either, with its arguments' shapes, strides and dtypes, and the GPU and library versions.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import runpy
import subprocess
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

HERE = os.path.dirname(os.path.abspath(__file__))


def describe(value):
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype)[6:],
                "device": value.device.type}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return str(value)


class Bracket(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = torch.cuda.memory_stats()
        out = func(*args, **kwargs)
        after = torch.cuda.memory_stats()
        key = "allocation.all.allocated", "allocation.all.freed"
        if after.get(key[0], 0) != before.get(key[0], 0) or "convolution" in str(func):
            outputs = [t.untyped_storage().nbytes() for t in tree_flatten(out)[0]
                       if isinstance(t, torch.Tensor) and t.device.type == "cuda"]
            self.calls.append({"op": str(func), "args": describe(list(args)),
                               "kwargs": {k: describe(v) for k, v in kwargs.items()},
                               "outputs": outputs, "thread_backward": torch._C._current_graph_task_id() != -1,
                               "window": [before.get(key[0], 0), after.get(key[0], 0),
                                          before.get(key[1], 0), after.get(key[1], 0)]})
        return out


def resolve(calls, trace, allocs0, frees0):
    """Each call's allocations (by cumulative count) matched to the history's entries."""
    alloc_at, free_at = [], []                  # (count, addr, size)
    for entry in trace:
        if entry["action"] == "alloc":
            alloc_at.append((entry["addr"], entry["size"]))
        elif entry["action"] == "free_requested":
            free_at.append(entry["addr"])
    rows = []
    for call in calls:
        a0, a1, f0, f1 = call.pop("window")
        made = alloc_at[a0 - allocs0:a1 - allocs0]
        freed = set(free_at[f0 - frees0:f1 - frees0])
        temporaries = [size for addr, size in made if addr in freed]
        kept = [size for addr, size in made if addr not in freed]
        extra = sorted(kept)
        for size in call["outputs"]:
            match = next((k for k in extra if k >= size), None)
            if match is not None:
                extra.remove(match)
        # every convolution is kept, those with no workspace too: the table needs its zeros
        if temporaries or extra or "convolution" in call["op"]:
            rows.append({**call, "temporaries": temporaries, "kept_beyond_outputs": extra})
    return rows


def measure(name: str) -> list[dict]:
    """Run workload `name` in this process under the bracket; its rows."""
    torch.cuda.memory._record_memory_history(max_entries=5_000_000, stacks="python")
    stats = torch.cuda.memory_stats()
    allocs0, frees0 = stats.get("allocation.all.allocated", 0), stats.get("allocation.all.freed", 0)
    bracket = Bracket()
    sys.argv = [os.path.join(HERE, "estimate_workloads.py"), name]
    with bracket:
        runpy.run_path(sys.argv[0], run_name="__main__")
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    return resolve(bracket.calls, trace, allocs0, frees0)


def main() -> None:
    if sys.argv[1] == "--one":                  # a child: one workload, rows as JSON on stdout
        props = torch.cuda.get_device_properties(0)
        env = {"gpu": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
               "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
        name = sys.argv[2]
        for row in measure(name):               # (the workload's run replaces sys.argv)
            print("ROW " + json.dumps({"workload": name, **env, **row}))
        return
    out_path, names = sys.argv[1], sys.argv[2:] or ["cnn_sgd", "cnn_wide", "unet", "cnn_accum", "mlp",
                                                    "mlp_amp", "encoder", "gpt_train", "gpt2_train",
                                                    "gpt2_amp", "bert_train", "llama_train"]

    def one(name):
        done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True,
                              timeout=600)
        rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        return name, rows, done.stderr[-1500:] if done.returncode else ""
    with concurrent.futures.ThreadPoolExecutor(8) as pool, open(out_path, "w") as log:
        for name, rows, error in pool.map(one, names):
            log.writelines(row + "\n" for row in rows)
            print(f"{name}: {len(rows)} operator calls with temporaries or state {error}", flush=True)


if __name__ == "__main__":
    main()
