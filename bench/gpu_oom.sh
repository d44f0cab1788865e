#!/usr/bin/env bash
# The GPU half of bench/oom_gpu.py (does tune's advice hold when a run dies of OOM?) in one
# command, from the repository root, on the machine with the GPU:
#     bash bench/gpu_oom.sh OUT_DIR [record flags, e.g. --workloads mlp gpt_train --jobs 8]
# Prints the GPU and the versions, runs `bench/oom_gpu.py record` under a global timeout (each
# run has its own, and no run starts after --budget), then packs the snapshots into at most four
# tar files of at most 15 MiB. OUT_DIR then holds results.jsonl, record.log, snapshots-N.tar.
# Afterwards, on any machine: python bench/oom_gpu.py compare OUT_DIR
set -uo pipefail
out=${1:?usage: bash bench/gpu_oom.sh OUT_DIR [record flags]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
started=$(date +%s)
nvidia-smi -L || echo "no nvidia-smi"
nvidia-smi --query-gpu=name,memory.total,memory.used,persistence_mode,compute_mode --format=csv || true
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'cuda available', torch.cuda.is_available())"
env | grep -E '^PYTORCH_(CUDA_|HIP_)?ALLOC_CONF=' || echo "no PYTORCH_*ALLOC_CONF in the environment (each run sets its own)"
echo "cores: $(nproc)"
timeout "${RECORD_LIMIT:-480}" python3 bench/oom_gpu.py record "$out" --jobs "${JOBS:-12}" "$@" 2>&1 | tee "$out/record.log"
echo "record exit: ${PIPESTATUS[0]} after $(( $(date +%s) - started )) s"
python3 bench/oom_gpu.py pack "$out" 2>&1 | tee -a "$out/record.log"
ls -la "$out"
echo "gpu_oom.sh: $(( $(date +%s) - started )) s"
