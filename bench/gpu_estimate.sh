#!/usr/bin/env bash
# The GPU half of `npumem estimate`'s checks, in one run from the repository root:
#     PYTHONPATH=$PWD/src bash bench/gpu_estimate.sh OUT_DIR
# Records the real runs (bench/estimate_truth.py) and the operators' temporaries
# (bench/kernel_temporaries.py) at once, packs them as OUT_DIR/truth.tar.gz.part-*, then runs
# the suite with the conformance suites on torch:cuda and the allocation benchmark.
set -uo pipefail
out=${1:?usage: bash bench/gpu_estimate.sh OUT_DIR}
mkdir -p "$out/truth"
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'transformers', transformers.__version__)"
timeout "${TRUTH_LIMIT:-240}" python3 bench/estimate_truth.py "$out/truth" --jobs 8 > "$out/truth/truth.log" 2>&1 &
timeout "${TRUTH_LIMIT:-240}" python3 bench/kernel_temporaries.py "$out/truth/temporaries.jsonl" > "$out/truth/temporaries.log" 2>&1 &
wait
cat "$out/truth/truth.log" "$out/truth/temporaries.log"
(cd "$out" && tar czf truth.tar.gz truth && rm -rf truth && split -b 15M truth.tar.gz truth.tar.gz.part- && rm truth.tar.gz)
ls -la "$out"
timeout "${PYTEST_LIMIT:-120}" env NPUMEM_DEVICE=torch:cuda python3 -m pytest -q -p no:cacheprovider -n 8 tests > "$out/pytest_cuda.log" 2>&1
tail -25 "$out/pytest_cuda.log"
timeout 60 python3 bench/alloc_latency.py --device torch:cuda > "$out/alloc_latency.log" 2>&1
tail -15 "$out/alloc_latency.log"
