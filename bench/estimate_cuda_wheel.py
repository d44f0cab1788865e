"""`npumem estimate` under a CUDA build of PyTorch (pip's default wheel) against the same
estimate under a CPU-only build: each workload of bench/estimate_workloads.py estimated with
both Pythons, which must give the same peaks to the byte (the stand-in device is the GPU in
both; native.py says how).

    python bench/estimate_cuda_wheel.py --cuda-python /path/to/venv-cu/bin/python [NAME ...]

--cpu-python defaults to this Python (its torch must be a CPU-only build). Prints, per workload,
the peak allocated and reserved under each and the seconds each estimate took (the first of each
Python includes building the stand-in device, once); also whether the CUDA build's fake run ever
asked for the NVIDIA driver (it must not). Exit status 1 when a peak differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
WORKLOADS = os.path.join(HERE, "estimate_workloads.py")
DEFAULT = ["mlp", "mlp_amp", "gpt_train", "cnn_sgd", "encoder", "gpt2_train", "llama_train"]
PEAKS = ("peak_allocated_bytes", "peak_reserved_bytes")


def estimate(python: str, args: list[str], gpu: str) -> tuple[dict, float, str]:
    """`npumem estimate --json` under `python` with this checkout's npumem: its JSON, the
    seconds it took, and how many times its fake run asked for the driver ("" if not told)."""
    with tempfile.TemporaryDirectory() as folder:
        calls = os.path.join(folder, "driver_calls")
        path = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path, NPUMEM_ESTIMATE_DRIVER_CALLS=calls)
        started = time.perf_counter()
        done = subprocess.run([python, "-c", "from npumem.cli import main; main()", "estimate",
                               "--json", "--gpu", gpu, "--", *args],
                              capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - started
        try:
            result = json.loads(done.stdout)
        except json.JSONDecodeError:
            result = {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        asked = open(calls).read() if os.path.exists(calls) else ""
    return result, seconds, asked


def torch_build(python: str) -> str:
    done = subprocess.run([python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                          capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=DEFAULT)
    parser.add_argument("--cuda-python", required=True, help="a Python whose torch is a CUDA build")
    parser.add_argument("--cpu-python", default=sys.executable)
    parser.add_argument("--gpu", default="h200")
    args = parser.parse_args()
    cpu_build, cuda_build = torch_build(args.cpu_python), torch_build(args.cuda_python)
    print(f"CPU build:  {cpu_build} ({args.cpu_python})")
    print(f"CUDA build: {cuda_build} ({args.cuda_python})")
    # the PyTorch an estimate models is the installed one (versions.py): model the same in both,
    # so that what is compared is the build alone
    os.environ.setdefault("NPUMEM_TORCH_VERSION", cpu_build.split()[0])
    print(f"modelled PyTorch: {os.environ['NPUMEM_TORCH_VERSION']} (NPUMEM_TORCH_VERSION)")
    print(f"{'workload':14} {'peak allocated cpu / cuda':>30} {'peak reserved cpu / cuda':>30} "
          f"{'same':>5} {'s cpu':>6} {'s cuda':>6} {'driver':>6}")
    differ = 0
    for name in args.names:
        cpu, cpu_s, _ = estimate(args.cpu_python, [WORKLOADS, name], args.gpu)
        cuda, cuda_s, asked = estimate(args.cuda_python, [WORKLOADS, name], args.gpu)
        if "error" in cpu or "error" in cuda:
            for build, result in (("cpu", cpu), ("cuda", cuda)):
                said = result.get("error") or ", ".join(f"{k} {result[k]:,}" for k in PEAKS)
                print(f"{name:14} {build}: {str(said)[:200]}")
            differ += 1
            continue
        same = all(cpu[k] == cuda[k] for k in PEAKS)
        differ += not same
        print(f"{name:14} {cpu[PEAKS[0]]:>14,} / {cuda[PEAKS[0]]:<14,} {cpu[PEAKS[1]]:>14,} / "
              f"{cuda[PEAKS[1]]:<14,} {'yes' if same else 'NO':>5} {cpu_s:6.1f} {cuda_s:6.1f} "
              f"{asked or '?':>6}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
