#!/usr/bin/env bash
# Everything ../shared/GPU.md asks of a GPU machine, in one run, from the repository root:
#     bash bench/gpu_all.sh OUT_DIR [TRACE_DIR]
# Each step's output goes to OUT_DIR/NAME.log (and the screen); the real CUDA allocator's
# recordings to OUT_DIR/snapshots (bench/record_workloads.py) and OUT_DIR/real
# (bench/real_allocator.py, replaying the traces in TRACE_DIR, default ../shared/data/traces).
# A failing step is reported and the rest still run; the exit status says whether any failed.
set -uo pipefail
out=${1:?usage: bash bench/gpu_all.sh OUT_DIR [TRACE_DIR]}
traces=${2:-../shared/data/traces}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
failed=()
step() {
    local name=$1; shift
    echo "== $name: $*"
    timeout "${STEP_LIMIT:-300}" "$@" > >(tee "$out/$name.log") 2>&1 || failed+=("$name")
}
parallel=$(python -c 'import xdist' 2>/dev/null && echo "-n 8")
nvidia-smi -L
step pytest python -m pytest -q -p no:cacheprovider $parallel tests
step demo npumem demo --device torch:cuda --size 64K
step ops python bench/ops.py --device torch:cuda
step alloc_latency python bench/alloc_latency.py --device torch:cuda
step pipeline_mul env NPUMEM_DEVICE=torch:cuda python bench/pipeline.py
step pipeline_matmul env NPUMEM_DEVICE=torch:cuda python bench/pipeline.py --op matmul \
    --batch-mib 64 --batches 24
step record python bench/record_workloads.py --device cuda "$out/snapshots"
for snapshot in "$out"/snapshots/*.pickle; do
    step "check_$(basename "$snapshot" .pickle)" npumem replay --check "$snapshot"
done
step real_allocator python bench/real_allocator.py "$traces"/*.jsonl.gz --record "$out/real"
echo "failed steps: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
