#!/bin/sh
# bench/fuzz_hostile.py against a copy of the working tree whose C extensions (the snapshot and
# JSONL readers, the native allocator model, the native pool, the planner) are built with
# AddressSanitizer and UndefinedBehaviorSanitizer (issue 64). Any report from either fails the
# input it read, as a crash or traceback does.
#
#   bench/fuzz_asan.sh MINUTES [more bench/fuzz_hostile.py flags]
#
# MINUTES is the time each target runs (the hour-long run of docs/reliability.md: 60 minutes
# over the ten targets below, 6 each). No memory limit: ASan's shadow memory is address space.
set -e
minutes=${1:-6}
shift || true
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/npumem-asan-XXXXXX)
# the working tree as it is (NPUMEM_ASAN_REV=commit: that commit instead)
if [ -n "$NPUMEM_ASAN_REV" ]; then
    (cd "$here" && git archive "$NPUMEM_ASAN_REV") | tar -xf - -C "$work"
else
    (cd "$here" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) |
        tar -xf - -C "$work"
fi
cd "$work"
CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g" \
LDFLAGS="-fsanitize=address,undefined" python setup.py -q build_ext --inplace >/dev/null
asan=$(gcc -print-file-name=libasan.so)
ubsan=$(gcc -print-file-name=libubsan.so)
targets=${NPUMEM_ASAN_TARGETS:-hostile-report,hostile-replay,hostile-python-replay,hostile-tune,hostile-jsonl-snapshot,hostile-jsonl-report,hostile-jsonl-replay,hostile-jsonl-pool,hostile-plan,pickle}
LD_PRELOAD="$asan $ubsan" ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONPATH="$work/src:$work" \
    python bench/fuzz_hostile.py --memory-mib 0 --count 100000000 --minutes "$minutes" \
    --targets "$targets" --budget-mib 100000 --budget-seconds 60 --keep "$here/fuzz-asan-failures" "$@"
rm -rf "$work"
