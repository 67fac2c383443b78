#!/usr/bin/env bash
# gpu-comm-check.sh — the comm check for a GPU machine: builds, runs the comm tests and the comm bench,
# and leaves at most 6 files under $OUT: build.log, tests.log, bench.log, comm.tsv, comm.md, comm.png.
# Usage (repo root): OUT=/some/dir bash tools/gpu-comm-check.sh [extra comm_bench args]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qtrain-comm-check}
mkdir -p "$OUT"
t0=$(date +%s)
{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/build.log" 2>&1
if ! make -j16 CUDA_ARCH=90a build/tests/test_comm_cpu build/tests/test_comm_gpu build/bench/comm_bench \
        >> "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    echo "BUILD FAILED"
    exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
{
    echo "== test_comm_cpu"; timeout 120 build/tests/test_comm_cpu; echo "exit $?"
    echo "== test_comm_gpu"; timeout 240 build/tests/test_comm_gpu; echo "exit $?"
} 2>&1 | tee "$OUT/tests.log"
echo "tests: $(( $(date +%s) - t0 )) s"
BENCH_OUT=$OUT BUILD=build timeout 420 bash bench/run.sh "$@" 2>&1 | tee "$OUT/bench.log"
echo "total: $(( $(date +%s) - t0 )) s"
ls -la "$OUT"
