#!/usr/bin/env bash
# gpu-nodes.sh — the multi-node check for one host with 2 or 4 GPUs: two emulated nodes as two processes
# with disjoint CUDA_VISIBLE_DEVICES, NCCL on its socket transport over the loopback
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo; test_internode sets them in its children).
# Builds the launch, rendezvous and inter-node tests and qtrain, runs them, then trains across 2 emulated
# nodes of 1 GPU (tests/test_nodes_train.py: bitwise against one process with 2 GPUs, bf16 / fp8, ZeRO 0-3;
# resume 2 nodes -> 1; a node killed mid-run) and, when build-mutants/ is there (carried; its qtrain and
# test_nodes_mutants), sees ZeRO over the nodes' planted bugs break those bits; leaves build.log and tests.log
# under $OUT.
# ONLY=scale instead measures scaling: 0.5B and 7B fp8 as shipped (train_bench, 3 steps after 1) as one process on
# all 2 x G GPUs and as 2 emulated nodes of G (G = half the host's GPUs), the fraction of the one process's
# tokens/s the nodes reach, and bench/nodes_bench's collectives between the nodes beside it (7B on 2 x H200: ~5.5
# minutes by its step times, so CONFIGS picks the rows of one call).
# Usage (repo root): OUT=/some/dir [QT_DATA_DIR=out/data] [ONLY=train|scale] [CONFIGS='a.yaml b.yaml' (scale's)]
#     bash tools/gpu-nodes.sh
# (ONLY=train: the training tests alone, 107 s on 2 H200s.)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qtrain-nodes-check}
mkdir -p "$OUT"
t0=$(date +%s)
{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/build.log" 2>&1
# the system cuDNN (9.14) is older than the headers (9.19): python3's wheel has 9.19 (see gpu-check.sh)
cudnn_lib=$(bash tools/prereqs.sh cudnn-wheel)
if [ -d "$cudnn_lib" ]; then export LD_LIBRARY_PATH=$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
# the carried binaries (tools/gpu-pack.sh) are used as they are; make builds only when they are absent
if [ -f build/dev/bins.tar.xz ]; then t=$(mktemp -d) && tar -C "$t" -xJf build/dev/bins.tar.xz && cp -a -u "$t"/. . && rm -rf "$t"; fi
need=(build/qtrain build/tests/test_launch build/tests/test_rendezvous build/tests/test_internode
      build/bench/train_bench build/bench/nodes_bench)
missing=0; for b in "${need[@]}"; do [ -x "$b" ] || missing=1; done
if [ "$missing" = 1 ] && ! make -j16 CUDA_ARCH=90a "${need[@]}" >> "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    echo "BUILD FAILED (no NCCL here? the Makefile leaves test_internode out without nccl.h and libnccl)"
    exit 1
fi
ldd build/tests/test_internode | grep -q 'libnccl.*not found' && { echo "libnccl.so.2 not found at run time"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
# scale CFG: train_bench's RESULT as one process on 2G GPUs, then as 2 nodes of G, and the fraction
scale() {
    local cfg=$1 name; name=$(basename "$cfg" .yaml)
    local one=$OUT/scale_${name}_1x$((2 * G)).log port=$((29600 + RANDOM % 1000)) devs0 devs1
    timeout 420 stdbuf -oL build/bench/train_bench "$cfg" --steps 3 --warmup 1 --set parallel.gpus=$((2 * G)) > "$one" 2>&1
    devs0=$(seq -s, 0 $((G - 1))) devs1=$(seq -s, "$G" $((2 * G - 1)))
    for k in 0 1; do
        local devs=$devs0; [ "$k" = 1 ] && devs=$devs1
        CUDA_VISIBLE_DEVICES=$devs NODE_RANK=$k NNODES=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 420 \
            stdbuf -oL build/bench/train_bench "$cfg" --steps 3 --warmup 1 --set parallel.gpus="$G" --set parallel.nodes=2 \
            > "$OUT/scale_${name}_2x${G}.node$k.log" 2>&1 &
    done
    wait
    python3 - "$one" "$OUT/scale_${name}_2x${G}.node0.log" <<'PY'
import json, sys
def res(p):
    for line in open(p):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.exit(f"{p}: no RESULT line (see the log)")
a, b = res(sys.argv[1]), res(sys.argv[2])
print(f"{a['config']}: 1 process x {a['gpus']} GPUs {a['tokens_per_s']:.0f} tokens/s, 2 nodes x {b['gpus'] // 2} "
      f"{b['tokens_per_s']:.0f} tokens/s ({b['model_tflops']:.1f} model TFLOP/s per GPU): {b['tokens_per_s'] / a['tokens_per_s']:.3f}")
PY
}
G=$(( $(nvidia-smi -L | grep -c '^GPU') / 2 ))
if [ "${ONLY:-}" = scale ] && [ "$G" -lt 1 ]; then echo "scale: needs 2 or more GPUs"; exit 1; fi
if [ "${ONLY:-}" = scale ]; then
    { for c in ${CONFIGS:-configs/qwen2.5-0.5b-fp8.yaml configs/qwen2.5-7b-fp8.yaml}; do scale "$c"; done
      echo "== nodes_bench"; timeout 600 build/bench/nodes_bench --md "$OUT/nodes.md"; echo "exit $?"; } 2>&1 | tee "$OUT/scale.log"
    echo "total: $(( $(date +%s) - t0 )) s"
    exit 0
fi
{
    if [ "${ONLY:-}" != train ]; then
        echo "== test_launch"; timeout 60 build/tests/test_launch; echo "exit $?"
        echo "== test_rendezvous"; timeout 120 build/tests/test_rendezvous; echo "exit $?"
        echo "== test_nodes_cli"; BUILD=build timeout 120 python3 tests/test_nodes_cli.py; echo "exit $?"
        echo "== test_internode"; NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 400 build/tests/test_internode; echo "exit $?"
    fi
    echo "== test_nodes_train"; NCCL_DEBUG=${NCCL_DEBUG:-WARN} BUILD=build timeout 540 python3 tests/test_nodes_train.py
    echo "exit $?"
    if [ -x build-mutants/tests/test_nodes_mutants ] && [ -x build-mutants/qtrain ]; then
        echo "== test_nodes_mutants (mutant build)"; NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 400 build-mutants/tests/test_nodes_mutants
        echo "exit $?"
    fi
} 2>&1 | tee "$OUT/tests.log"
echo "total: $(( $(date +%s) - t0 )) s"
