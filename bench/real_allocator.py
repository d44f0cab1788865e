"""Allocation traces through PyTorch's real CUDA caching allocator, against npumem's model of it
and npumem's own pool, in one run. Needs a CUDA GPU.

    python bench/real_allocator.py [TRACE ...] [--record DIR] [--json]

Defaults to every trace in ../shared/data/traces/. Each trace's allocations and frees run in
order as torch.empty(size, dtype=torch.uint8, device="cuda") and del, from an empty cache
(streams are ignored: everything runs on the current stream, as the model is replayed). The real
allocator's peak reserved bytes and segment allocations are read from torch.cuda.memory_stats().
The same events then go through `replay(events, "torch")`, npumem's model of that allocator,
and through npumem's pool (default settings). The real run is recorded with
torch.cuda.memory._record_memory_history; the model then replays that recording with --check,
so a mismatch is named decision by decision. --record DIR keeps the recordings as
DIR/NAME.pickle for `npumem replay --check`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import pickle
import sys

import torch

from npumem.alloc.torch_model import from_snapshot
from npumem.trace import read_trace
from npumem.trace.snapshot import recording_from_data
from defaults import traces as default_traces
from npumem.whatif.replay import replay
from npumem.whatif.torch_replay import replay_recording
from npumem.units import format_size



def real_replay(events) -> tuple[dict, dict]:
    """({peak_reserved, device_allocs, peak_allocated}, snapshot) of the real allocator."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_stats().get("num_device_alloc", 0)
    torch.cuda.memory._record_memory_history(max_entries=max(len(events) * 2, 1000), context=None)
    live = {}
    try:
        for event in events:
            if event.action == "alloc":
                live[event.addr] = torch.empty(event.size, dtype=torch.uint8, device="cuda")
            else:
                live.pop(event.addr, None)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        live.clear()
    stats = torch.cuda.memory_stats()
    result = {"peak_reserved": stats["reserved_bytes.all.peak"],
              "device_allocs": stats.get("num_device_alloc", 0) - before,
              "peak_allocated": stats["allocated_bytes.all.peak"]}
    torch.cuda.empty_cache()
    return result, snapshot


def compare(path: pathlib.Path, record_dir: pathlib.Path | None) -> dict:
    events = list(read_trace(str(path)))
    name = path.name.split(".")[0]
    real, snapshot = real_replay(events)
    model = replay(events, "torch", trace_name=name)
    pool = replay(events, "pool", trace_name=name)
    recording = recording_from_data(snapshot, name)
    checked = replay_recording(recording, from_snapshot(recording.settings, recording.flavour),
                               check=True)
    if record_dir is not None:
        with open(record_dir / f"{name}.pickle", "wb") as handle:
            pickle.dump(snapshot, handle)
    return {"trace": name, "events": len(events),
            "real_peak_reserved": real["peak_reserved"], "real_device_allocs": real["device_allocs"],
            "model_peak_reserved": model.peak_reserved_bytes, "model_device_allocs": model.device_allocs,
            "model_exact": (model.peak_reserved_bytes == real["peak_reserved"]
                            and model.device_allocs == real["device_allocs"]),
            "recording_check": "MATCH" if checked.faithful else
                               (checked.divergence.describe() if checked.divergence else "peak differs"),
            "pool_peak_reserved": pool.peak_reserved_bytes,
            "pool_over_real": pool.peak_reserved_bytes / real["peak_reserved"],
            "peak_live": model.peak_allocated_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=pathlib.Path)
    parser.add_argument("--record", type=pathlib.Path, metavar="DIR",
                        help="keep each real run's memory snapshot as DIR/NAME.pickle")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: PyTorch sees none on this machine")
    traces = [pathlib.Path(p) for p in args.traces or default_traces()]
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in traces:
        rows.append(compare(path, args.record))
        print(f"{path.name}: done", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "rows": rows}))
        return
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'trace':16} {'peak live':>10} {'real':>10} {'model':>10} {'segs real/model':>16} "
          f"{'pool':>10} {'pool/real':>9}  check")
    for r in rows:
        print(f"{r['trace']:16} {format_size(r['peak_live']):>10} "
              f"{format_size(r['real_peak_reserved']):>10} {format_size(r['model_peak_reserved']):>10} "
              f"{r['real_device_allocs']:>7}/{r['model_device_allocs']:<8} "
              f"{format_size(r['pool_peak_reserved']):>10} {r['pool_over_real']:>9.3f}  "
              f"{r['recording_check'].splitlines()[0]}")


if __name__ == "__main__":
    main()
