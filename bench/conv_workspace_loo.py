"""How well the cuDNN convolution workspace model (src/npumem/estimate/conv_workspace.py)
generalises: each workload of the measured table (cudnn_workspaces.json) left out in turn.

    python bench/conv_workspace_loo.py [--no-peaks] [NAME ...]

The table's 70 convolutions come from cnn_sgd, cnn_wide, unet and cnn_accum
(bench/kernel_temporaries.py); the table does not say which, so each workload is run here on the
meta device and its convolutions' keys are matched. For each workload:

- workspace: the model calibrated on every entry (in sample) and on the other workloads' entries
  only (out of sample), against the measured workspaces of the left-out workload's calls: per
  call, the largest workspace (what can land on a peak), as |log2| of (predicted + 1 MiB) /
  (measured + 1 MiB): median, worst, and the calls within 2x; and all bytes predicted / measured.
  The old rule (outside the table: 12.2x the call's input and weight bytes) beside it.
- peak: bench/estimate_accuracy.py's estimate against tests/data/estimate_truth.jsonl (H200),
  each setting, with the measured table (the shipped behaviour: exact in sample), the model
  alone calibrated on everything, and the model calibrated without the workload, its entries
  removed from the table (NPUMEM_CONV_TABLE, NPUMEM_CONV_MEASURED=0, read by kernel_rules.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from npumem.estimate import conv_workspace  # noqa: E402
from npumem.estimate.kernel_rules import TABLE, _describe  # noqa: E402

MiB = 1 << 20
WORKLOADS = ["cnn_sgd", "cnn_wide", "unet", "cnn_accum"]


class _Keys(TorchDispatchMode):
    """The kernel_rules key of every convolution and convolution_backward dispatched."""

    def __init__(self):
        super().__init__()
        self.keys: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in ("convolution", "convolution_backward"):
            data, weight, bias, rest = ((args[0], args[1], args[2], args[3:9]) if name == "convolution"
                                        else (args[1], args[2], args[3], args[4:11]))
            kind = "forward" if name == "convolution" else "backward"
            self.keys.add(json.dumps([kind, _describe(data), _describe(weight), bias is not None,
                                      *[list(a) if isinstance(a, (list, tuple)) else a for a in rest]]))
        return func(*args, **(kwargs or {}))


def group_by_workload(entries) -> dict:
    """workload -> its table entries, from its convolutions run on the meta device."""
    import record_workloads
    zoo = record_workloads._workloads()
    groups = {}
    for name in WORKLOADS:
        keys = _Keys()
        torch.manual_seed(0)
        with torch.device("meta"):
            run = zoo[name]()
            with keys:
                run()
        groups[name] = [e for e in entries if json.dumps(e[0]) in keys.keys]
    placed = sum(len(g) for g in groups.values())
    assert placed == len(entries), f"{len(entries) - placed} table entries in no workload"
    return groups


def call_error(predicted: list[int], measured: list[int]) -> float:
    """|log2| of the largest workspace, each with 1 MiB added (a few KiB either way is nothing)."""
    return abs(math.log2((max(predicted, default=0) + MiB) / (max(measured, default=0) + MiB)))


def old_bound(entries) -> float:
    return max(sum(s) / max(1, _io_bytes(k)) for k, s in entries)


def _io_bytes(key) -> int:
    size = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
    return sum(math.prod(shape) * size.get(dtype, 4) for dtype, shape, _ in (key[1], key[2]))


def score(rows, predict) -> dict:
    errors = sorted(call_error(predict(k), v) for k, v in rows)
    return {"median": errors[len(errors) // 2], "worst": errors[-1],
            "within_2x": sum(e <= 1 for e in errors), "calls": len(rows),
            "bytes": sum(sum(predict(k)) for k, _ in rows) / max(1, sum(sum(v) for _, v in rows))}


def workspace_table(groups) -> None:
    everything = [e for rows in groups.values() for e in rows]
    full = conv_workspace.fit(everything)
    print("workspace per call (largest of the call), |log2| of (pred + 1 MiB) / (measured + 1 MiB):")
    print(f"{'workload':10} {'model':22} {'median':>7} {'worst':>6} {'<=2x':>7} {'bytes pred/meas':>16}")
    for name, rows in groups.items():
        others = [e for n, r in groups.items() if n != name for e in r]
        loo = conv_workspace.fit(others)
        bound = old_bound(others)
        for label, predict in (
                ("model, in sample", lambda k: [w.likely for w in conv_workspace.predict_key(k, full)]),
                ("model, out of sample", lambda k: [w.likely for w in conv_workspace.predict_key(k, loo)]),
                ("old bound, out", lambda k: [int(bound * _io_bytes(k))])):
            s = score(rows, predict)
            print(f"{name:10} {label:22} {s['median']:7.2f} {s['worst']:6.2f} "
                  f"{s['within_2x']:>3}/{s['calls']:<3} {s['bytes']:16.2f}")
        covered = sum(max(v, default=0) <= max((w.high for w in conv_workspace.predict_key(k, loo)), default=0)
                      for k, v in rows)
        print(f"{'':10} out of sample: the largest measured within the stated range on {covered}/{len(rows)} "
              f"calls; calibration {_brief(loo)}")
    print(f"calibration on all {len(everything)}: {_brief(full)}")


def _brief(cal) -> str:
    return (f"forward gate {cal.forward_macs:.3g} MACs, data gate {cal.data_macs:.3g} MACs, "
            f"weight {cal.weight_ratio:.2f}x, wide {cal.weight_ratio_wide:.2f}x (high {cal.weight_high:.2f}x), "
            f"1x1 strided weight from {cal.weight_pointwise_channels:.0f} channels")


def peak_table(groups, names) -> None:
    from npumem.estimate.run import estimate
    rows = [json.loads(line) for line in open(os.path.join(ROOT, "tests", "data", "estimate_truth.jsonl"))]
    with open(TABLE) as handle:
        table = json.load(handle)
    print("\npeak reserved, predicted / real (H200 truth), per setting:")
    settings = ("default", "expandable", "split128", "pow2div8")
    print(f"{'workload':10} {'convolution workspaces':34} " + " ".join(f"{s:>10}" for s in settings))
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            truth = [r for r in rows if r["name"] == name and "error" not in r]
            if not truth:
                continue
            reduced = os.path.join(folder, f"without_{name}.json")
            with open(reduced, "w") as handle:
                kept = [e for n, r in groups.items() if n != name for e in r]
                json.dump({**table, "entries": kept}, handle)
            for label, env in (("measured table (in sample, exact)", {}),
                               ("model alone, in sample", {"NPUMEM_CONV_MEASURED": "0"}),
                               ("model, out of sample", {"NPUMEM_CONV_MEASURED": "0",
                                                         "NPUMEM_CONV_TABLE": reduced})):
                ratios = []
                for row in truth:
                    saved = {k: os.environ.get(k) for k in ("NPUMEM_CONV_MEASURED", "NPUMEM_CONV_TABLE")}
                    os.environ.update(env)
                    try:
                        with open(os.devnull, "w") as quiet:
                            result = estimate(os.path.join(HERE, "estimate_workloads.py"), [name], gpu="h200",
                                              settings=row["conf"], script_output=quiet)
                    finally:
                        for k, v in saved.items():
                            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
                    ratios.append(result.current.peak_reserved_bytes / row["peak_reserved"])
                print(f"{name:10} {label:34} " + " ".join(f"{r:10.3f}" for r in ratios), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=["cnn_sgd", "cnn_wide", "unet"])
    parser.add_argument("--no-peaks", action="store_true", help="the workspace comparison only")
    args = parser.parse_args()
    with open(TABLE) as handle:
        entries = json.load(handle)["entries"]
    groups = group_by_workload(entries)
    workspace_table(groups)
    if not args.no_peaks:
        peak_table(groups, args.names)


if __name__ == "__main__":
    main()
