#!/usr/bin/env bash
# gpu-par.sh — several tools/gpu-check.sh suite lists at once, list i on GPU i, so one device call on a
# multi-GPU machine does that much more work: `tools/gpu-par.sh "unit" "memory" "model reliability"`. Logs
# under $OUT/g<i> (each list's own gpu-check logs) and $OUT/g<i>.txt (its output). Never put two host-heavy
# runs (offloaded 7B/14B ones: 100-230 GiB of pinned memory each) at once on a machine whose host memory
# cannot hold both, nor timings meant for comparison beside another run. BUDGET (seconds, default 560)
# bounds each list. With fewer GPUs than lists, list i runs on GPU i mod the count (lists share a GPU).
# A list may start with VAR=value words (e.g. ONLY="test_zero|test_plan memory": gpu-check's steps
# whose name matches).
set -uo pipefail
cd "$(dirname "$0")/.."
root=${OUT:-out/gpu-check}
mkdir -p "$root"
# the carried binaries in place once, not by every list at once (tools/gpu-check.sh does it for one list)
if [ -f build/dev/bins.tar.xz ]; then t=$(mktemp -d) && tar -C "$t" -xJf build/dev/bins.tar.xz && cp -a -u "$t"/. . && rm -rf "$t"; fi
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$ngpu" -ge 1 ] || ngpu=1
i=0
for list in "$@"; do
    vars=(); stages=()
    for w in $list; do case "$w" in *=*) vars+=("$w") ;; *) stages+=("$w") ;; esac; done
    ( env CUDA_VISIBLE_DEVICES=$((i % ngpu)) OUT=$root/g$i "${vars[@]}" timeout "${BUDGET:-560}" bash tools/gpu-check.sh "${stages[@]}" > "$root/g$i.txt" 2>&1
      echo "g$i exit $?" >> "$root/g$i.txt" ) &
    i=$((i + 1))
done
wait
for ((j = 0; j < i; j++)); do echo "====== g$j"; cat "$root/g$j.txt"; done
