#!/usr/bin/env bash
# gpu-pack.sh — the binaries a device call needs, stripped, under build/dev (~46 MiB: under the device
# tool's 64 MiB carry): qtrain, libqtrain.so, every test and tool in build/tests, the benches. Build first
# here (`make CUDA_ARCH=90a`), then carry build/dev; tools/gpu-check.sh puts them in place on a machine
# whose build/ holds nothing else (the device's copy of the tree).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf build/dev
mkdir -p build/dev/tests build/dev/bench
strip -o build/dev/qtrain build/qtrain
strip -o build/dev/libqtrain.so build/libqtrain.so
for f in build/tests/* build/bench/*; do
    case "$f" in *.o | *.d) continue ;; esac
    [ -f "$f" ] && [ -x "$f" ] && strip -o "build/dev/${f#build/}" "$f"
done
du -sh build/dev
