#!/usr/bin/env bash
# gpu-par.sh — two tools/gpu-check.sh stage lists at once on a 2-GPU machine, one per GPU, so one device
# call does twice the work: `tools/gpu-par.sh "pending17" "grid"`. Logs under $OUT/g0 and $OUT/g1 (each
# list's own gpu-check logs) and $OUT/g0.txt, $OUT/g1.txt (their output). Never put two host-heavy stages
# (offloaded 7B/14B runs: 100-230 GiB of pinned memory each) on the two GPUs at once, nor timings meant
# for comparison beside another run. BUDGET (seconds, default 560) bounds each list.
set -uo pipefail
cd "$(dirname "$0")/.."
root=${OUT:-out/gpu-check}
mkdir -p "$root"
( CUDA_VISIBLE_DEVICES=0 OUT=$root/g0 timeout "${BUDGET:-560}" bash tools/gpu-check.sh $1 > "$root/g0.txt" 2>&1
  echo "g0 exit $?" >> "$root/g0.txt" ) &
if [ -n "${2:-}" ]; then
    ( CUDA_VISIBLE_DEVICES=1 OUT=$root/g1 timeout "${BUDGET:-560}" bash tools/gpu-check.sh $2 > "$root/g1.txt" 2>&1
      echo "g1 exit $?" >> "$root/g1.txt" ) &
fi
wait
cat "$root/g0.txt"
[ -f "$root/g1.txt" ] && { echo "======"; cat "$root/g1.txt"; }
