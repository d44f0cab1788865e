"""Record the truth that `npumem estimate` is checked against: each workload of
bench/estimate_workloads.py run on a real GPU under each allocator setting, in its own process.

    python bench/estimate_truth.py OUT_DIR [NAME ...] [--jobs 8]

For each NAME and setting it writes OUT_DIR/NAME@SETTING.pickle (the caching allocator's
snapshot with Python stacks, as `torch.cuda.memory._dump_snapshot` writes it) and one line of
OUT_DIR/truth.jsonl: peak reserved and peak allocated from `torch.cuda.memory_stats`, the GPU,
and the versions of CUDA, cuDNN, PyTorch and transformers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import pickle
import runpy
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SETTINGS = {"default": "", "expandable": "expandable_segments:True",
            "split128": "max_split_size_mb:128", "pow2div8": "roundup_power2_divisions:8"}
NAMES = ["mlp", "mlp_amp", "encoder", "gpt_train", "gpt_generate", "cnn_sgd", "cnn_wide", "unet",
         "lstm", "gpt2_train", "gpt2_amp", "bert_train", "llama_train", "llama_generate"]


def child(out: str, argv: list[str]) -> None:
    """Run estimate_workloads.py with argv under the allocator's history; write out.pickle and
    print the figures as one JSON line."""
    import torch
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    sys.argv = [str(HERE / "estimate_workloads.py"), *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")
    torch.cuda.synchronize()
    with open(out + ".pickle", "wb") as handle:
        pickle.dump(torch.cuda.memory._snapshot(), handle)
    stats = torch.cuda.memory_stats()
    props = torch.cuda.get_device_properties(0)
    try:
        import transformers
        hf = transformers.__version__
    except ImportError:
        hf = None
    print("TRUTH " + json.dumps({
        "peak_reserved": stats["reserved_bytes.all.peak"], "peak_allocated": stats["allocated_bytes.all.peak"],
        "gpu": props.name, "sm_count": props.multi_processor_count, "total_memory": props.total_memory,
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "transformers": hf}))


def run_one(out_dir: pathlib.Path, name: str, setting: str) -> dict:
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=SETTINGS[setting])
    base = str(out_dir / f"{name}@{setting}")
    row = {"name": name, "setting": setting, "conf": SETTINGS[setting]}
    try:
        done = subprocess.run([sys.executable, __file__, "--child", base, name], env=env,
                              capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {**row, "error": "timed out after 600 s"}
    line = next((x for x in done.stdout.splitlines() if x.startswith("TRUTH ")), None)
    if line is None:
        row["error"] = (done.stderr or done.stdout)[-2000:]
    else:
        row.update(json.loads(line[6:]))
    return row


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=pathlib.Path)
    parser.add_argument("names", nargs="*", default=NAMES)
    parser.add_argument("--jobs", type=int, default=8)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    cases = [(name, setting) for name in args.names for setting in SETTINGS]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool, \
            open(args.out_dir / "truth.jsonl", "a") as log:
        for row in pool.map(lambda case: run_one(args.out_dir, *case), cases):
            log.write(json.dumps(row) + "\n")
            log.flush()
            figures = row.get("error", "")[-300:] or \
                f"reserved {row['peak_reserved'] / 2**20:.1f} MiB, allocated {row['peak_allocated'] / 2**20:.1f} MiB"
            print(f"{row['name']}@{row['setting']}: {figures}", flush=True)


if __name__ == "__main__":
    main()
