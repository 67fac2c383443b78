#!/usr/bin/env bash
# gpu-pack.sh — the binaries a device call needs, stripped, in one xz tarball build/dev/bins.tar.xz (~16 MiB,
# under the device tool's 64 MiB carry; the binaries share most of their bytes): build/ qtrain, libqtrain.so,
# every test and tool in build/tests, the benches; and, when built (`make MUTANTS=1 CUDA_ARCH=90a`), the
# mutant build's tests and qtrain under build-mutants/. Build first here (`make CUDA_ARCH=90a`), then carry
# build/dev; tools/gpu-check.sh and tools/gpu-par.sh unpack it on the device's copy of the tree (files that
# a newer make there wrote are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for b in build build-mutants; do
    [ -x "$b/qtrain" ] || continue
    mkdir -p "$tmp/$b/tests" "$tmp/$b/bench"
    strip -o "$tmp/$b/qtrain" "$b/qtrain"
    [ -f "$b/libqtrain.so" ] && strip -o "$tmp/$b/libqtrain.so" "$b/libqtrain.so"
    for f in "$b"/tests/* "$b"/bench/*; do
        case "$f" in *.o | *.d) continue ;; esac
        [ -f "$f" ] && [ -x "$f" ] && strip -o "$tmp/$f" "$f"
    done
done
rm -rf build/dev && mkdir -p build/dev
tar -C "$tmp" -cf - . | xz -T0 -6 > build/dev/bins.tar.xz
du -sh build/dev/bins.tar.xz
