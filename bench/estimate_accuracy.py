"""How close `npumem estimate` comes to real GPU runs: each workload of
bench/estimate_workloads.py estimated on this machine (no GPU) under the four settings
bench/estimate_truth.py recorded it with, against the recorded peaks.

    python bench/estimate_accuracy.py [--truth tests/data/estimate_truth.jsonl] [NAME ...]

Prints, per workload and setting, predicted / real for peak reserved and peak allocated, and
the fake run's operators per second. The truth file's lines name the GPU and versions; each
estimate models the PyTorch and cuDNN the row was recorded with (--torch-version, --cudnn).

Every row here is IN SAMPLE: these runs were seen while the rules were written (the cuDNN
convolution table was measured on cnn_sgd, cnn_wide, unet and cnn_accum; the attention
backward workspaces were checked against gpt_train and gpt2_amp). The `sample` column says
which rule saw which run. Out-of-sample figures: bench/conv_workspace_loo.py (each CNN
workload left out of the convolution model) and runs recorded by others (docs/estimate.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from npumem.estimate.run import ScriptFailed, estimate  # noqa: E402
from npumem.units import format_size  # noqa: E402


# which rule saw which run (every run was seen by the replay model and the estimate's author)
SAMPLE = {name: "in: cuDNN convolution table" for name in ("cnn_sgd", "cnn_wide", "unet",
                                                           "cnn_accum")}
SAMPLE.update({name: "in: attention backward workspace" for name in ("gpt_train", "gpt2_amp")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--truth", default=os.path.join(os.path.dirname(HERE), "tests", "data",
                                                        "estimate_truth.jsonl"))
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.truth)]
    names = args.names or sorted({r["name"] for r in rows}, key=[r["name"] for r in rows].index)
    first = rows[0]
    print(f"truth: {first['gpu']}, torch {first['torch']}, CUDA {first['cuda']}, cuDNN {first['cudnn']}, "
          f"transformers {first['transformers']}")
    print(f"{'workload':16} {'setting':28} {'reserved pred/real':>24} {'ratio':>6} "
          f"{'allocated ratio':>15} {'us/op':>6}  sample")
    worst = []
    for name in names:
        for row in (r for r in rows if r["name"] == name and "error" not in r):
            started = time.perf_counter()
            try:
                result = estimate(os.path.join(HERE, "estimate_workloads.py"), [name], gpu="h200",
                                  settings=row["conf"],
                                  versions={"torch_version": row["torch"],
                                            "cudnn_version": str(row["cudnn"])})
            except ScriptFailed as exc:
                print(f"{name:16} {row['conf'] or 'default':28} failed: {exc}", flush=True)
                break
            ratio = result.current.peak_reserved_bytes / row["peak_reserved"]
            allocated = result.current.peak_allocated_bytes / row["peak_allocated"]
            run = result.run
            worst.append((abs(ratio - 1), name, row["setting"], ratio))
            print(f"{name:16} {row['conf'] or 'default':28} "
                  f"{format_size(result.current.peak_reserved_bytes):>11} / "
                  f"{format_size(row['peak_reserved']):<11} {ratio:6.3f} {allocated:15.3f} "
                  f"{1e6 * run['op_seconds'] / max(run['ops'], 1):6.0f}  {SAMPLE.get(name, 'in')}"
                  f"  ({time.perf_counter() - started:.0f} s)",
                  flush=True)
    within = sum(1 for w in worst if w[0] <= 0.03)
    print(f"within 3% of the real peak reserved: {within} of {len(worst)}; "
          f"worst: {max(worst)[1]} {max(worst)[2]} {max(worst)[3]:.3f}")


if __name__ == "__main__":
    main()
