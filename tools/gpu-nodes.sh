#!/usr/bin/env bash
# gpu-nodes.sh — the multi-node check for one host with 2 or 4 GPUs: two emulated nodes as two processes
# with disjoint CUDA_VISIBLE_DEVICES, NCCL on its socket transport over the loopback
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo; test_internode sets them in its children).
# Builds the launch, rendezvous and inter-node tests and qtrain, runs them, then trains across 2 emulated
# nodes of 1 GPU (tests/test_nodes_train.py: bitwise against one process with 2 GPUs, bf16 / fp8, ZeRO 0-3;
# resume 2 nodes -> 1; a node killed mid-run) and, when build-mutants/ is there (carried; its qtrain and
# test_nodes_mutants), sees ZeRO over the nodes' planted bugs break those bits; leaves build.log and tests.log
# under $OUT.
# Usage (repo root): OUT=/some/dir [QT_DATA_DIR=out/data] [ONLY=train] bash tools/gpu-nodes.sh
# (ONLY=train: the training test alone, about 3 minutes on 2 H200s.)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qtrain-nodes-check}
mkdir -p "$OUT"
t0=$(date +%s)
{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/build.log" 2>&1
if ! make -j16 CUDA_ARCH=90a build/qtrain build/tests/test_launch build/tests/test_rendezvous \
        build/tests/test_internode >> "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    echo "BUILD FAILED (no NCCL here? the Makefile leaves test_internode out without nccl.h and libnccl)"
    exit 1
fi
ldd build/tests/test_internode | grep -q 'libnccl.*not found' && { echo "libnccl.so.2 not found at run time"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
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
