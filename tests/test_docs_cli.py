#!/usr/bin/env python3
"""test_docs_cli.py — data.attention and data.positions in a run: the startup line says which is used
(document by default when the shards carry document starts, causal otherwise), and attention per document
trains other numbers than causal attention on the same packed shards. On a GPU (skips without one): the
document-masked cuDNN graphs are taken (no fallback note), and eager, CUDA-graph and recomputed runs with
the attention backward in slices give the same bits, in bf16 and fp8; two data-parallel ranks train."""
import json
import os
import shutil
import subprocess
import sys

from qt_test import BUILD, ROOT, Skip, run_tests

QTRAIN = os.path.join(BUILD, "qtrain")
CFG = os.path.join(ROOT, "configs", "tiny-cpu.yaml")
SMALL = ["--set", "device=cpu", "--set", "optim.warmup=1", "--set", "eval.every=0", "--set", "data.micro_batch=2",
         "--set", "data.seq_len=32", "--set", "log.every=1", "--set", "optim.steps=2", "--set", "checkpoint.every=0"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def shards(tmp, name, *flags):
    """Byte-level shards of short documents in tmp/name (made once)."""
    d = os.path.join(tmp, name)
    if not os.path.isdir(d):
        src = os.path.join(tmp, "docs.txt")
        with open(src, "w") as f:
            f.write("\n\n".join(f"{i}: a stage" + "!" * (i % 5) for i in range(600)))  # 2-3 per window
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tokenize"), "--byte-level", src, "--out", d,
                            "--eval-frac", "0.1", "--quiet", *flags], capture_output=True, text=True)
        if r.returncode and "numpy" in r.stderr:
            raise Skip("tools/tokenize needs numpy")
        assert r.returncode == 0, r.stderr
    return ["--set", f"data.train={name}/train_*.bin"]


def train(tmp, data, run, *extra):
    if not os.access(QTRAIN, os.X_OK):
        raise Skip(f"{QTRAIN} not built")
    r = subprocess.run([QTRAIN, CFG, "--set", f"run.dir={run}", *data, *SMALL, *extra], capture_output=True, text=True,
                       cwd=tmp, timeout=300, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def losses(tmp, run):
    """(loss, grad_norm) of each train record of run's log.jsonl."""
    recs = [json.loads(l) for l in open(os.path.join(tmp, run, "log.jsonl")) if '"train"' in l]
    return [(r["loss"], r["grad_norm"]) for r in recs]


def test_document_by_default_with_starts(tmp):
    data = shards(tmp, "packed", "--doc-sep", r"\n\n", "--seq-len", "32")
    doc = train(tmp, data, "runs/doc")
    assert "attention per document, RoPE positions restarting at each document (the shards carry document starts" \
        in doc, doc
    causal = train(tmp, data, "runs/causal", "--set", "data.attention=causal")
    assert "attention causal over the window, RoPE positions over the window (data.attention" in causal, causal
    a, b = losses(tmp, "runs/doc"), losses(tmp, "runs/causal")
    assert len(a) == 2 and len(b) == 2 and a[0] != b[0], (a, b)  # the first step already differs
    train(tmp, data, "runs/doc2", "--set", "data.attention=document")
    assert losses(tmp, "runs/doc2") == a, (losses(tmp, "runs/doc2"), a)  # auto resolved to document: the same bits
    # LoRA over the same base: its engine passes the documents to the base model too
    lora = ["--set", "lora.rank=4", "--set", "lora.alpha=8"]
    ld = train(tmp, data, "runs/lora_doc", *lora)
    assert "attention per document" in ld, ld
    train(tmp, data, "runs/lora_causal", *lora, "--set", "data.attention=causal")
    assert losses(tmp, "runs/lora_doc")[0] != losses(tmp, "runs/lora_causal")[0]


def test_causal_without_starts(tmp):
    """A shard written without document starts (version 2) keeps causal attention over the window."""
    data = shards(tmp, "plain")
    subprocess.run([sys.executable, "-c", f"""
import glob, struct, zlib
for p in glob.glob({os.path.join(tmp, 'plain', '*.bin')!r}):
    b = bytearray(open(p, 'rb').read())
    n = struct.unpack_from('<Q', b, 16)[0]; flags = struct.unpack_from('<I', b, 28)[0]
    nd = struct.unpack_from('<Q', b, 40)[0]
    tb = struct.unpack_from('<I', b, 12)[0]
    payload = b[64:64 + n * tb + (n if flags & 1 else 0)]
    hdr = b'QTTOKENS' + struct.pack('<IIQII', 2, tb, n, struct.unpack_from('<I', b, 24)[0], flags & 1)
    hdr += struct.pack('<Q', zlib.crc32(payload)) + bytes(64 - len(hdr) - 8)
    open(p, 'wb').write(hdr + payload)
"""], check=True)
    out = train(tmp, data, "runs/plain")
    assert "attention causal over the window, RoPE positions over the window (the shards carry no document " \
        "starts; 0 of" in out, out


GPU_PRECISION = {"bf16": [], "fp8": ["--set", "precision.matmul_dtype=e4m3", "--set", "precision.grad_dtype=e4m3"]}
GPU_MODES = {"eager": ["--set", "perf.cuda_graphs=false"],
             "graphs": ["--set", "perf.cuda_graphs=true"],
             "recompute": ["--set", "perf.cuda_graphs=true", "--set", "memory.recompute=[block]",
                           "--set", "memory.attn_bwd_chunks=2"]}


def test_gpu_document_attention(tmp):
    if not shutil.which("nvidia-smi") or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
        raise Skip("no CUDA device")
    data = shards(tmp, "packed", "--doc-sep", r"\n\n", "--seq-len", "32")
    base = ["--set", "device=cuda", "--set", "memory.plan=manual", "--set", "perf.matmul_autotune=false",
            "--set", "optim.steps=4", "--set", "data.grad_accum=2"]
    gpu = base + ["--set", "data.attention=document"]
    for prec, pset in GPU_PRECISION.items():
        got = {}
        for mode, mset in GPU_MODES.items():
            out = train(tmp, data, f"runs/gpu_{prec}_{mode}", *gpu, *pset, *mset)
            assert "attention per document, RoPE positions restarting" in out and "not available" not in out, out
            got[mode] = losses(tmp, f"runs/gpu_{prec}_{mode}")
        assert len(got["eager"]) == 4 and got["graphs"] == got["eager"] and got["recompute"] == got["eager"], (prec, got)
        train(tmp, data, f"runs/gpu_{prec}_causal", *gpu, *pset, "--set", "data.attention=causal")
        assert losses(tmp, f"runs/gpu_{prec}_causal")[0] != got["eager"][0], prec
    # data.attention left to auto: per document on the GPU too (the shards carry starts), the same bits
    out = train(tmp, data, "runs/gpu_auto", *base, *GPU_MODES["eager"])
    assert "attention per document, RoPE positions restarting at each document (the shards carry" in out, out
    assert losses(tmp, "runs/gpu_auto") == losses(tmp, "runs/gpu_bf16_eager")
    # data parallel: two ranks sharing GPU 0, each handed its own windows' documents
    out = train(tmp, data, "runs/gpu_dp", *gpu, "--set", "parallel.devices=[0,0]", "--set", "data.micro_batch=1")
    assert "attention per document" in out and len(losses(tmp, "runs/gpu_dp")) == 4, out


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
