#!/usr/bin/env bash
# gpu-lanes.sh — gpu-check.sh stage lists side by side on a machine with several GPUs, lane i on GPU i alone
# (CUDA_VISIBLE_DEVICES=i: a lane's ranks share its GPU, as the one-GPU checks are written), so that one device
# call holds what would take several one after the other. Each argument is a lane: "STAGES" or
# "REGEX@STAGES" (REGEX becomes that lane's ONLY: the steps whose name matches it whole). Logs: the lane's
# console in $OUT/laneI.txt, its stage logs under $OUT/laneI/. LANE_LIMIT (seconds, default 560) ends a lane
# that runs on, so the logs still come back within one call.
#   tools/gpu-lanes.sh 'test_zero@resolve' 'test_offload@resolve'
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu-lanes}
mkdir -p "$OUT"
# the carried binaries once, before the lanes (each gpu-check.sh would copy them at once, over each other)
if [ -d build/dev ]; then cp -a -u build/dev/. build/; fi
i=0
for lane in "$@"; do
    only=""; stages=$lane
    case $lane in *@*) only=${lane%%@*}; stages=${lane#*@};; esac
    # the lanes' scratch (checkpoints, token files) stays off $OUT; only the logs are copied back
    ( CUDA_VISIBLE_DEVICES=$i ONLY=$only OUT=/tmp/gpu-lanes/lane$i timeout "${LANE_LIMIT:-560}" bash tools/gpu-check.sh $stages \
          > "$OUT/lane$i.txt" 2>&1
      echo "== lane $i ($lane): exit $? at $(date +%T)" >> "$OUT/lane$i.txt"
      mkdir -p "$OUT/lane$i"; cp /tmp/gpu-lanes/lane$i/*.log "$OUT/lane$i/" 2>/dev/null ) &
    i=$((i + 1))
done
wait
tail -n 3 "$OUT"/lane*.txt
