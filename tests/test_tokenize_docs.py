#!/usr/bin/env python3
"""test_tokenize_docs.py — the document starts of shard format v3 written by tools/tokenize: every
input format (text with --doc-sep, JSON lines, Parquet, a `datasets` folder, chat), documents cut into
pieces across tasks, shards cut anywhere, and --seq-len packing (padding, split and dropped documents,
neighbouring shards sharing a token); and the trainer's loader handing them out per window."""
import json
import os
import subprocess
import sys

from qt_test import BUILD, Skip, run_tests
from test_tokenize import CHATML, all_tokens, chat_rows, chat_tokenizer, read_shard, run_tool, shards
from test_tokenize_inputs import datasets_folder, need_pyarrow

LENS = [5, 1, 12, 30, 7, 2, 19, 3]
DOCS = [bytes(65 + (i + k) % 26 for k in range(n)) for i, n in enumerate(LENS)]


def stream_starts(out, packed_seq=0):
    """The global document starts of all shards of out (train then eval), in stream positions; packed
    shards share their boundary token, so a start there is listed twice, once."""
    starts, at = set(), 0
    for p in shards(out, "train_") + shards(out, "eval_"):
        h, _, _ = read_shard(p)
        starts |= {at + d for d in h["docs"]}
        at += h["n"] - (1 if packed_seq else 0)
    return sorted(starts)


def expected(lens, eos=1):
    out, at = [], 0
    for n in lens:
        out.append(at)
        at += n + eos
    return out


def test_doc_starts_every_format(tmp):
    """Byte-level documents with an EOS after each: their starts are the running sums of their lengths,
    whatever the format, the chunking (a 30-byte document in 8-byte pieces) or the shard cuts."""
    src = {"text": os.path.join(tmp, "d.txt"), "jsonl": os.path.join(tmp, "d.jsonl")}
    open(src["text"], "wb").write(b"\x00".join(DOCS))
    open(src["jsonl"], "w").write("".join(json.dumps({"text": d.decode()}) + "\n" for d in DOCS))
    try:
        pa = need_pyarrow()
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"text": [d.decode() for d in DOCS]}), os.path.join(tmp, "d.parquet"), row_group_size=3)
        src["parquet"] = os.path.join(tmp, "d.parquet")
        datasets_folder(pa, os.path.join(tmp, "ds"), [pa.table({"text": [d.decode() for d in DOCS]})])
        src["datasets"] = os.path.join(tmp, "ds")
    except Skip:
        pass
    for name, path in src.items():
        out = os.path.join(tmp, "out-" + name)
        run_tool("--byte-level", path, "--doc-sep", "\\x00", "--eos-id", "0", "--chunk-bytes", "8", "--shard-tokens",
                 "11", "--eval-frac", "0.2", "--out", out, "--quiet")
        got = stream_starts(out)
        assert got == expected(LENS), f"{name}: starts {got}, expected {expected(LENS)}"
        toks, _ = all_tokens(out)
        assert [toks[s] for s in got] == [d[0] for d in DOCS], f"{name}: a start is not a document's first token"
    if "parquet" not in src:
        raise Skip("text and JSON lines passed; no pyarrow for Parquet and datasets")


def test_doc_starts_chat(tmp):
    """Each conversation starts a document: its first token is <|im_start|>, the one before it EOS."""
    tok, tj = chat_tokenizer(tmp, CHATML)
    src = os.path.join(tmp, "c.jsonl")
    rows = chat_rows() * 3
    open(src, "w").write("".join(json.dumps(r) + "\n" for r in rows))
    out = os.path.join(tmp, "out")
    run_tool("--tokenizer", tj, "--chat", src, "--out", out, "--eval-frac", "0", "--quiet")
    toks, _ = all_tokens(out)
    got = stream_starts(out)
    start, eos = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert len(got) == len(rows) and got[0] == 0, f"{len(got)} starts for {len(rows)} conversations"
    assert all(toks[s] == start for s in got) and all(toks[s - 1] == eos for s in got[1:]), got


def test_doc_starts_packed(tmp):
    """test_packing's layout (documents of 3, 10, 9, 17, 40 and 16 tokens in windows of 17): the starts
    follow the documents over the padding; a dropped document has none, a split one one."""
    src = os.path.join(tmp, "in.txt")
    lens = [3, 10, 9, 17, 40, 16]
    open(src, "wb").write(b"\x00".join(bytes([65 + i] * (n - 1)) for i, n in enumerate(lens)))
    want = {"drop": [0, 3, 16, 32, 49], "split": [0, 3, 16, 32, 64, 112]}
    for mode, starts in want.items():
        out = os.path.join(tmp, mode)
        run_tool("--byte-level", src, "--doc-sep", "\\x00", "--eos-id", "255", "--pad-id", "0", "--seq-len", "16",
                 "--long", mode, "--eval-frac", "0.25", "--shard-tokens", "40", "--out", out, "--quiet")
        got = stream_starts(out, packed_seq=16)
        assert got == starts, f"{mode}: starts {got}, expected {starts}"


def test_loader_reads_tool_starts(tmp):
    """The trainer's loader on the tool's packed shards: each window's document starts (tools/
    tool_doc_starts prints them) equal the shard's starts inside the window."""
    tool = os.path.join(BUILD, "tests", "tool_doc_starts")
    if not os.path.exists(tool):
        raise Skip(f"{tool} not built (make)")
    src = os.path.join(tmp, "in.txt")
    open(src, "wb").write(b"\x00".join(DOCS * 3))
    out = os.path.join(tmp, "out")
    run_tool("--byte-level", src, "--doc-sep", "\\x00", "--eos-id", "0", "--seq-len", "16", "--eval-frac", "0",
             "--out", out, "--quiet")
    path = shards(out, "train_")[0]
    h, toks, _ = read_shard(path)
    r = subprocess.run([tool, path, "16"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for line in r.stdout.splitlines():
        w, *pos = map(int, line.split())
        want = [d - 16 * w for d in h["docs"] if 16 * w <= d < 16 * w + 16]
        assert pos == want, f"window {w}: loader starts {pos}, shard {want}"
    assert len(r.stdout.splitlines()) == (h["n"] - 1) // 16, r.stdout


def main():
    try:
        import numpy  # noqa: F401 — tools/tokenize needs it
    except ImportError:
        print("SKIP test_tokenize_docs: no numpy (pip install numpy)")
        return 0
    return run_tests(globals(), sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
