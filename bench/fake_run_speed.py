"""The fake run's cost per operator: `npumem estimate`'s fake run (recording, shadows, kernel
rules, the operator cache) against its floor in PyTorch, a bare FakeTensorMode under one
dispatch mode that only counts and times the operators.

    python bench/fake_run_speed.py [--repeat 3] [--steps 40] [WORKLOAD ...]

WORKLOAD: `loop` (a transformer encoder trained for --steps steps, the steady state), or any
name of bench/estimate_workloads.py (short runs: 3 to 8 steps, where each operator's first call
weighs most). Each run is a fresh process, as an estimate is: PyTorch imports and initialises
much on an operator's first fake call, so a second run in one process would be handed the
first one's warm-up. The two sides alternate, --repeat times; medians are printed, with the
ratio npumem / FakeTensorMode. Operators are the aten operators the script dispatches;
PyTorch's device queries of fake tensors (prim.device) are answered but not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
sys.path.insert(0, SRC)

LOOP = textwrap.dedent("""
    import sys, torch, torch.nn as nn
    steps = int(sys.argv[1])
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), 4).cuda()
    head = nn.Linear(256, 1000).cuda()
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-4)
    for step in range(steps):
        x = torch.randn(8, 128, 256, device="cuda")
        y = torch.randint(0, 1000, (8, 128), device="cuda")
        loss = nn.functional.cross_entropy(head(model(x)).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
""")

PEER_SECONDS = 180

# the peer: the script under FakeTensorMode, one mode above it timing each operator
PEER = textwrap.dedent("""
    import ctypes, json, runpy, sys, time, warnings
    warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    # only so that module.to("cuda") works on fake tensors (PyTorch's swap refuses them); it
    # changes no operator's cost
    from npumem.estimate.fake_run import _parameters_moved_in_place
    _parameters_moved_in_place(torch, FakeTensor)
    device_of, item = torch.ops.prim.device.default, torch.ops.aten._local_scalar_dense.default
    counts = {"ops": 0, "ns": 0}
    class Timing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is item:            # .item(): FakeTensorMode has no value to give
                counts["ops"] += 1
                return False if args[0].dtype == torch.bool else (
                    1.0 if args[0].dtype.is_floating_point else 1)
            started = time.perf_counter_ns()
            try:
                return func(*args, **(kwargs or {}))
            finally:
                counts["ns"] += time.perf_counter_ns() - started
                counts["ops"] += func is not device_of
    out = sys.argv[2]
    sys.argv = sys.argv[3:]
    started = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True), Timing():
        runpy.run_path(sys.argv[0], run_name="__main__")
    with open(out, "w") as handle:
        json.dump({"ops": counts["ops"], "op_seconds": counts["ns"] / 1e9,
                   "seconds": time.perf_counter() - started}, handle)
""")


def _peer(library: str, script: list[str], folder: str) -> dict:
    """None where the script cannot run on a bare FakeTensorMode (a value it needs)."""
    out = os.path.join(folder, "peer.json")
    try:
        done = subprocess.run([sys.executable, "-c", PEER, library, out, *script],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=_environment(), timeout=PEER_SECONDS)
    except subprocess.TimeoutExpired:      # a loop that never ends on its placeholder values
        print(f"  (FakeTensorMode alone: not done after {PEER_SECONDS} s)")
        return None
    if done.returncode != 0:
        print(f"  (FakeTensorMode alone: {done.stderr.strip().splitlines()[-1][:150]})")
        return None
    with open(out) as handle:
        return json.load(handle)


def _environment() -> dict:
    return dict(os.environ, NPUMEM_FAKE_DEVICES="1", NPUMEM_ESTIMATE="1",
                PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])))


def _npumem(library: str, script: list[str], folder: str) -> dict:
    from npumem.estimate.run import BOOT
    spec = {"script": script[0], "args": script[1:], "gpu": "h100", "device": "cuda",
            "library": library, "capacity": 80 << 30, "settings": "", "assume": {}, "devices": 1,
            "out": os.path.join(folder, "recording.pickle")}
    spec_path = os.path.join(folder, "spec.json")
    with open(spec_path, "w") as handle:
        json.dump(spec, handle)
    subprocess.run([sys.executable, "-c", BOOT, library, spec_path], check=True,
                   stdout=subprocess.DEVNULL, env=_environment())
    with open(spec["out"] + ".json") as handle:
        result = json.load(handle)
    if result.get("error"):
        raise RuntimeError(f"the fake run failed: {result['error']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=["loop", "gpt_train", "gpt2_train",
                                                         "llama_generate"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="steps of the `loop` workload")
    args = parser.parse_args()
    from npumem.estimate import native
    library = native.stand_in_library()
    print(f"{'workload':16} {'operators':>9} {'FakeTensorMode us/op':>21} {'npumem us/op':>13} "
          f"{'npumem ops/s':>13} {'ratio':>6}")
    with tempfile.TemporaryDirectory(prefix="npumem-bench-") as folder:
        loop = os.path.join(folder, "loop.py")
        with open(loop, "w") as handle:
            handle.write(LOOP)
        for name in args.workloads:
            script = [loop, str(args.steps)] if name == "loop" else \
                [os.path.join(HERE, "estimate_workloads.py"), name]
            peer, ours, ops = [], [], 0
            for _ in range(args.repeat):
                measured = _peer(library, script, folder) if peer is not None else None
                peer = None if measured is None else \
                    [*peer, 1e6 * measured["op_seconds"] / max(measured["ops"], 1)]
                measured = _npumem(library, script, folder)
                ours.append(1e6 * measured["op_seconds"] / max(measured["ops"], 1))
                ops = measured["ops"]
            o = statistics.median(ours)
            if peer:
                p = statistics.median(peer)
                print(f"{name:16} {ops:9,} {p:21.1f} {o:13.1f} {1e6 / o:13,.0f} {o / p:6.2f}",
                      flush=True)
            else:
                print(f"{name:16} {ops:9,} {'-':>21} {o:13.1f} {1e6 / o:13,.0f} {'-':>6}",
                      flush=True)


if __name__ == "__main__":
    main()
