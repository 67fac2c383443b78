#!/usr/bin/env bash
# make quickstart: a byte-level corpus from text at hand, a tiny model trained for about a minute (GPU
# when present, else the CPU reference path), a checkpoint, an HF export and a loss plot.
set -euo pipefail
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
run=runs/quickstart
rm -rf "$run"
mkdir -p "$run"
# The corpus: tinyshakespeare when ../shared has it, else this repository's own text (it ships with
# the code, so quickstart needs nothing from outside).
if [ -f ../shared/data/tinyshakespeare.txt ]; then
    src=../shared/data/tinyshakespeare.txt
else
    src=$run/corpus.txt
    find README.md configs tools src include cuda comm -type f \( -name '*.md' -o -name '*.c' -o -name '*.h' -o -name '*.cu' \) \
        -print0 | sort -z | xargs -0 cat > "$src"
fi
python3 tools/tokenize --byte-level "$src" --out "$run/data" --eval-frac 0.05
"$BUILD/qtrain" configs/tiny-cpu.yaml "$@"
if python3 -c 'import matplotlib' 2>/dev/null; then
    python3 tools/plot "$run/log.jsonl" -o "$run/curves.png" --title "quickstart (byte-level)"
fi
if python3 -c 'import torch, transformers' 2>/dev/null; then # the export must load in transformers
    python3 tools/check_export.py "$run/ckpt/export" "$run/data/eval_000000.bin" 2>/dev/null
fi
echo "quickstart: checkpoints in $run/ckpt, HF export in $run/ckpt/export, log $run/log.jsonl"
