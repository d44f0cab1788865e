"""What the profiler costs: an allocation-heavy loop with tracking off, on, and on with stacks;
and (`--pytorch`) a GPT-2 training script from transformers under `npumem profile`.

    python bench/profile_overhead.py [--pairs 20000] [--rounds 7] [--depth 12] [--json]
    python bench/profile_overhead.py --pytorch [--rounds 3] [--steps 10]

`--pytorch` runs the same small GPT-2 training script (transformers, a model made from a config
with random weights; CPU) plainly, under `npumem profile`, and under torch.profiler's memory
recording (what npumem profile used on CPU before its tensor recorder), each in a fresh process,
rounds alternating; it prints the medians of wall time and peak RSS and their ratios to the
plain run. Targets: wall <= 1.5x plain; peak RSS <= plain + max(200 MB, 2x the traced peak).

Two loops over mixed sizes (512 B to 16 MiB, all cache hits) on the simulated NPU, called
`--depth` Python frames deep as a framework would: `tensors` creates and drops npumem tensors
(what user code does), `pool` calls caching_allocator_alloc/delete directly (the cheapest
allocation there is, so the worst case for the profiler's relative cost). Rounds alternate the
three modes; medians are reported. Targets: tracking without stacks at most 1.3x the loop with
tracking off; with stacks, under 5 us per event (each alloc and each free is one event).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import npumem
import npumem.memory as mem
from npumem import profile


def sizes(count: int) -> list[int]:
    rng = np.random.default_rng(0)
    return [int(s) for s in np.exp(rng.uniform(np.log(512), np.log(16 << 20), count))]


def pool_loop(requests: list[int], depth: int) -> int:
    """Alloc/free every request `depth` frames down; returns nanoseconds spent."""
    if depth > 1:
        return pool_loop(requests, depth - 1)
    alloc, free, clock = mem.caching_allocator_alloc, mem.caching_allocator_delete, time.perf_counter_ns
    start = clock()
    for n in requests:
        free(alloc(n))
    return clock() - start


def tensor_loop(requests: list[int], depth: int) -> int:
    """Create and drop a uint8 tensor of each size `depth` frames down."""
    if depth > 1:
        return tensor_loop(requests, depth - 1)
    empty, clock = npumem.empty, time.perf_counter_ns
    start = clock()
    for n in requests:
        tensor = empty((n,), "uint8")
        del tensor
    return clock() - start


LOOPS = {"tensors": tensor_loop, "pool": pool_loop}


GPT2_SCRIPT = """\
import sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
torch.set_num_threads(1)
config = GPT2Config(vocab_size=2048, n_positions=128, n_embd=256, n_layer=4, n_head=4)
model = GPT2LMHeadModel(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(int(sys.argv[1])):
    tokens = torch.randint(0, config.vocab_size, (8, 128))
    loss = model(tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# A child process: run the script in one mode, print its wall time and peak RSS as JSON.
CHILD = """\
import json, resource, runpy, sys, time
mode, script, steps, out = sys.argv[1:5]
sys.argv = [script, steps]
start = time.perf_counter()
if mode == "plain":
    runpy.run_path(script, run_name="__main__")
elif mode == "torch.profiler":
    import torch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True, with_stack=True) as prof:
        runpy.run_path(script, run_name="__main__")
    prof.export_chrome_trace(out + "/trace.json")
else:
    from npumem.cli import main
    try:
        main(["profile", "--out", out, "--force", "--", script, steps])
    except SystemExit:
        pass
wall = time.perf_counter() - start
print(json.dumps({"wall_s": wall, "maxrss_mb": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def pytorch_script(rounds: int, steps: int, as_json: bool) -> None:
    import os
    import subprocess
    import sys
    import tempfile

    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise SystemExit("--pytorch needs transformers: pip install transformers")
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "gpt2_train.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(GPT2_SCRIPT)
        runs: dict[str, list[dict]] = {"plain": [], "npumem profile": [], "torch.profiler": []}
        for _ in range(rounds):
            for mode in runs:
                out = tempfile.mkdtemp(dir=folder)
                done = subprocess.run([sys.executable, "-c", CHILD, mode, script, str(steps), out],
                                      capture_output=True, text=True, check=True)
                runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
        traced_peak = _traced_peak_mb(folder, script, steps)
    plain = {key: statistics.median(r[key] for r in runs["plain"]) for key in ("wall_s", "maxrss_mb")}
    result = {"machine": f"{platform.machine()} {platform.processor() or platform.system()}, "
                         f"Python {platform.python_version()}",
              "rounds": rounds, "steps": steps, "traced_peak_mb": round(traced_peak, 1)}
    for mode, values in runs.items():
        wall = statistics.median(r["wall_s"] for r in values)
        rss = statistics.median(r["maxrss_mb"] for r in values)
        result[mode] = {"wall_s": round(wall, 2), "wall_ratio": round(wall / plain["wall_s"], 3),
                        "peak_rss_mb": round(rss, 1),
                        "rss_over_plain_mb": round(rss - plain["maxrss_mb"], 1)}
    if as_json:
        print(json.dumps(result))
        return
    allowed = max(200.0, 2 * traced_peak)
    print(f"machine: {result['machine']}; GPT-2 (4 layers, 256 wide) training, {steps} steps, "
          f"{rounds} rounds; PyTorch's traced peak {traced_peak:.1f} MB")
    for mode in runs:
        r = result[mode]
        print(f"{mode:<15} wall {r['wall_s']:7.2f} s  ratio {r['wall_ratio']:.3f}  peak RSS "
              f"{r['peak_rss_mb']:8.1f} MB  (+{r['rss_over_plain_mb']:.1f} MB)")
    print(f"targets for npumem profile: wall ratio <= 1.5; RSS over plain <= {allowed:.0f} MB")


def _traced_peak_mb(folder: str, script: str, steps: int) -> float:
    """PyTorch's peak allocated bytes for the script, from a profile of it."""
    import os
    import pickle
    import subprocess
    import sys

    out = os.path.join(folder, "peak")
    subprocess.run([sys.executable, "-m", "npumem", "profile", "--out", out, "--", script,
                    str(steps)], capture_output=True, check=True)
    from npumem.profile.analysis import analyze_snapshot

    with open(os.path.join(out, "torch_snapshot.pickle"), "rb") as handle:
        snapshot = pickle.load(handle)
    return max(d.peak_allocated for d in analyze_snapshot(snapshot)) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--depth", type=int, default=12, help="Python frames above the loop")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pytorch", action="store_true",
                        help="Time a GPT-2 training script under npumem profile instead")
    parser.add_argument("--steps", type=int, default=10, help="--pytorch: training steps")
    args = parser.parse_args()
    if args.pytorch:
        pytorch_script(args.rounds, args.steps, args.json)
        return

    npumem.init()
    npumem.set_device(0)
    requests = sizes(args.pairs)
    modes = {"off": None, "on": dict(stacks=False), "stacks": dict(stacks=True)}
    result = {
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}, "
                   f"Python {platform.python_version()}",
        "pairs": args.pairs, "rounds": args.rounds, "depth": args.depth,
    }
    for loop_name, loop in LOOPS.items():
        loop(requests, 1)                             # warm: every timed request is a cache hit
        times: dict[str, list[float]] = {name: [] for name in modes}
        events = 0
        for _ in range(args.rounds):
            for name, options in modes.items():
                if options is None:
                    spent = loop(requests, args.depth)
                else:
                    with profile.track(max_entries=4 * args.pairs, **options) as tracker:
                        spent = loop(requests, args.depth)
                    events = len(tracker.events())
                times[name].append(spent / args.pairs / 1e3)     # us per alloc+free pair
        pair = {name: statistics.median(values) for name, values in times.items()}
        per_pair = events / args.pairs
        result[loop_name] = {
            "pair_us_off": round(pair["off"], 3), "pair_us_tracking": round(pair["on"], 3),
            "pair_us_stacks": round(pair["stacks"], 3),
            "tracking_ratio": round(pair["on"] / pair["off"], 3),
            "stacks_ratio": round(pair["stacks"] / pair["off"], 3),
            "events_per_pair": per_pair,
            "us_per_event_tracking": round((pair["on"] - pair["off"]) / per_pair, 3),
            "us_per_event_stacks": round((pair["stacks"] - pair["off"]) / per_pair, 3),
        }
    npumem.reset_device(0)
    npumem.finalize()
    if args.json:
        print(json.dumps(result))
        return
    print(f"machine: {result['machine']}; {args.pairs} pairs x {args.rounds} rounds, "
          f"{args.depth} frames deep")
    for loop_name in LOOPS:
        r = result[loop_name]
        print(f"{loop_name:<8} tracking off      {r['pair_us_off']:8.3f} us per alloc+free pair")
        print(f"{loop_name:<8} tracking on       {r['pair_us_tracking']:8.3f} us  ratio "
              f"{r['tracking_ratio']:.3f} (target <= 1.3)  {r['us_per_event_tracking']:.3f} us/event")
        print(f"{loop_name:<8} tracking + stacks {r['pair_us_stacks']:8.3f} us  ratio "
              f"{r['stacks_ratio']:.3f}  {r['us_per_event_stacks']:.3f} us/event (target < 5)")


if __name__ == "__main__":
    main()
