#!/usr/bin/env bash
# `make bench`: runs every benchmark section in turn. Outputs go under $BENCH_OUT (default
# $BUILD/bench-out); each section appends its markdown to $BENCH_OUT/<section>.md for bench/RESULTS.md.
# Extra arguments are passed to the comm bench. New sections go below, each guarded by its binary.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
OUT_DIR=${BENCH_OUT:-$BUILD/bench-out}

# Every section needs a GPU: without one (or in the CPU-only build) say so and what was skipped.
sections="comm (bench/comm_bench: our collectives against NCCL), nodes (bench/nodes_bench: between 2 emulated nodes),"\
" nf4 (bench/nf4_bench: NF4 dequantize GB/s)"
if ! ls "$BUILD"/bench/*_bench >/dev/null 2>&1; then
    echo "make bench: no benchmark binaries in $BUILD/bench (a CPU-only build: built without CUDA);" \
         "skipped: $sections; nothing written"
    exit 0
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "make bench: no GPU on this machine (nvidia-smi lists none); skipped: $sections; nothing written"
    exit 0
fi
mkdir -p "$OUT_DIR"

# ---- comm: our strategies + NCCL, then NCCL alone with P2P disabled (a fresh process: NCCL reads
# its environment once), then the plot. NCCL_NVLS_ENABLE=0 is forced inside comm_bench as well.
if [ -x "$BUILD/bench/comm_bench" ]; then
    rm -f "$OUT_DIR/comm.tsv" "$OUT_DIR/comm.md" "$OUT_DIR/comm.png"
    export NCCL_NVLS_ENABLE=0
    t0=$(date +%s)
    "$BUILD/bench/comm_bench" --tsv "$OUT_DIR/comm.tsv" --md "$OUT_DIR/comm.md" "$@" || echo "comm_bench failed ($?)"
    if [ -s "$OUT_DIR/comm.tsv" ]; then
        ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
        if [ "$ngpu" -ge 4 ]; then # the N = 2 row on a bigger box, without the overlap run
            "$BUILD/bench/comm_bench" --ranks 2 --no-overlap --tsv "$OUT_DIR/comm.tsv" --md "$OUT_DIR/comm.md" "$@" ||
                echo "comm_bench --ranks 2 failed ($?)"
        fi
        NCCL_P2P_DISABLE=1 "$BUILD/bench/comm_bench" --nccl-only --nccl-p2p-disable --tsv "$OUT_DIR/comm.tsv" \
            --md "$OUT_DIR/comm.md" "$@" || echo "comm_bench (NCCL, P2P off) failed ($?)"
        python3 tools/plot_comm.py "$OUT_DIR/comm.tsv" "$OUT_DIR/comm.png" "$OUT_DIR/comm.md" || echo "plot skipped"
    fi
    echo "comm section: $(( $(date +%s) - t0 )) s; outputs in $OUT_DIR (comm.tsv, comm.md, comm.png)"
fi

# ---- nodes: the hierarchical collectives between 2 emulated nodes (half the GPUs each, NCCL sockets over the
# loopback) against NCCL alone over every GPU (docs/multi-node.md)
if [ -x "$BUILD/bench/nodes_bench" ]; then
    rm -f "$OUT_DIR/nodes.md"
    t0=$(date +%s)
    "$BUILD/bench/nodes_bench" --md "$OUT_DIR/nodes.md" || echo "nodes_bench failed ($?)"
    echo "nodes section: $(( $(date +%s) - t0 )) s; outputs in $OUT_DIR (nodes.md)"
fi

# ---- nf4: the NF4 dequantize (QLoRA's base weights) at 4096 x 4096 and 14336 x 4096, beside a copy
if [ -x "$BUILD/bench/nf4_bench" ]; then
    rm -f "$OUT_DIR/nf4.md"
    "$BUILD/bench/nf4_bench" --md "$OUT_DIR/nf4.md" || echo "nf4_bench failed ($?)"
    echo "nf4 section: outputs in $OUT_DIR (nf4.md)"
fi
