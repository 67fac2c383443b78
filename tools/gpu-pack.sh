#!/usr/bin/env bash
# gpu-pack.sh — the binaries a device call needs, stripped, under build/dev (~46 MiB: under the device
# tool's 64 MiB carry): qtrain, libqtrain.so, every test and tool in build/tests, the benches; and, when
# built (`make CUDA_ARCH=90a test-mutants`), the mutant build's tests and qtrain in one xz tarball
# build/dev/mutants.tar.xz (~3 MiB: the binaries share most of their bytes). Build first here (`make
# CUDA_ARCH=90a`), then carry build/dev; tools/gpu-check.sh puts them in place on a machine whose build/
# holds nothing else (the device's copy of the tree) and unpacks the tarball into build-mutants/.
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
if [ -x build-mutants/qtrain ]; then
    tmp=$(mktemp -d)
    mkdir -p "$tmp/build-mutants/tests"
    strip -o "$tmp/build-mutants/qtrain" build-mutants/qtrain
    for f in build-mutants/tests/test_*; do
        case "$f" in *.o | *.d) continue ;; esac
        [ -f "$f" ] && [ -x "$f" ] && strip -o "$tmp/$f" "$f"
    done
    tar -C "$tmp" -cJf build/dev/mutants.tar.xz build-mutants
    rm -rf "$tmp"
    du -sh build/dev/mutants.tar.xz
fi
du -sh build/dev
