#!/usr/bin/env python3
"""test_tokenize_pairs.py — tools/tokenize --pairs: preference rows (prompt, chosen, rejected) from JSON lines and
Parquet into version 4 pair shards (each sequence in a window of its own, the mask on the response only, whole
pairs per shard), checked token by token against a hand rendering; the bad rows' errors naming file:line; the
shards trained by qtrain with objective: dpo, its console and JSONL log carrying the DPO means.
    BUILD=build python3 tests/test_tokenize_pairs.py"""
import json
import os
import struct
import subprocess
import sys
import zlib

from qt_test import ROOT, Skip, run_tests
from test_tokenize import CHATML, chat_tokenizer, ids, run_tool

S = 36


def read_pair_shard(path):
    """(header dict, tokens, mask, document starts) after checking the version 4 pair layout and CRC."""
    data = open(path, "rb").read()
    assert data[:8] == b"QTTOKENS", f"{path}: magic"
    ver, tb, n, vocab, flags, csum, n_docs, s = struct.unpack_from("<IIQIIQQI", data, 8)
    assert ver == 4 and flags == 7, f"{path}: version {ver}, flags {flags} (expected 4, mask|docs|pairs 7)"
    assert data[52:64] == bytes(12), f"{path}: header padding not zero"
    assert (n - 1) % (2 * s) == 0, f"{path}: {n} tokens is no 2 P x {s} + 1"
    payload = data[64:]
    assert zlib.crc32(payload) == csum, f"{path}: CRC-32"
    toks = list(struct.unpack(f"<{n}{'H' if tb == 2 else 'I'}", payload[:n * tb]))
    mask = list(payload[n * tb:n * tb + n])
    docs = list(struct.unpack(f"<{n_docs}Q", payload[n * tb + n:]))
    return {"n": n, "seq_len": s, "vocab": vocab}, toks, mask, docs


ROWS = [
    {"prompt": "question 1?", "chosen": "answer 1 is yes", "rejected": "no"},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "question 2?"}],
     "chosen": [{"role": "assistant", "content": "yes"}], "rejected": [{"role": "assistant", "content": "answer 9"}]},
    {"prompt": "question 3?", "chosen": "answer 3", "rejected": "answer 3 is yes and yes and yes and yes and yes and yes and yes"},
]


def hand(tok, turns, eos):
    """Tokens and mask of a ChatML conversation with the mask on its last turn (the response) only."""
    t, m = [], []
    for i, (role, content) in enumerate(turns):
        head, body = ids(tok, f"<|im_start|>{role}\n"), ids(tok, f"{content}<|im_end|>\n")
        t += head + body
        m += [0] * len(head) + [1 if i == len(turns) - 1 else 0] * len(body)
    return t + [eos], m + [0]


def test_pairs_layout_by_hand(tmp):
    """Each sequence starts its own window of S tokens, padded (mask 0); chosen then rejected; the mask covers the
    response's tokens only; a pair longer than S is dropped and counted; the header is version 4 with S."""
    tok, tj = chat_tokenizer(tmp, CHATML)
    eos = tok.token_to_id("<|im_end|>")
    src = os.path.join(tmp, "p.jsonl")
    open(src, "w").write("".join(json.dumps(r) + "\n" for r in ROWS))
    out = os.path.join(tmp, "out")
    r = run_tool("--tokenizer", tj, "--pairs", "--seq-len", str(S), src, "--out", out, "--eval-frac", "0", "--quiet")
    assert "1 preference pairs longer than --seq-len (dropped), the first at" in r.stderr and "p.jsonl:3" in r.stderr, r.stderr
    assert "pairs 2," in r.stdout, r.stdout
    h, toks, mask, docs = read_pair_shard(os.path.join(out, "train_000000.bin"))
    assert h["seq_len"] == S and h["n"] == 2 * 2 * S + 1, h
    want = [hand(tok, [("user", "question 1?"), ("assistant", "answer 1 is yes")], eos),
            hand(tok, [("user", "question 1?"), ("assistant", "no")], eos),
            hand(tok, [("system", "Be brief."), ("user", "question 2?"), ("assistant", "yes")], eos),
            hand(tok, [("system", "Be brief."), ("user", "question 2?"), ("assistant", "answer 9")], eos)]
    assert docs == [k * S for k in range(4)], docs
    for k, (wt, wm) in enumerate(want):
        got_t, got_m = toks[k * S:k * S + S], mask[k * S:k * S + S]
        assert got_t[:len(wt)] == wt and got_m[:len(wm)] == wm, f"sequence {k}: {got_t} {got_m} vs {wt} {wm}"
        assert got_t[len(wt):] == [eos] * (S - len(wt)) and not any(got_m[len(wt):]), f"sequence {k}: padding"
    assert toks[-1] == eos and mask[-1] == 0


def test_pairs_parquet_same_as_jsonl(tmp):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise Skip("no pyarrow")
    _, tj = chat_tokenizer(tmp, CHATML)
    rows = [r for r in ROWS if isinstance(r["prompt"], str)] * 3
    src = os.path.join(tmp, "p.jsonl")
    open(src, "w").write("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(tmp, "p.parquet"))
    outs = []
    for f in ("p.jsonl", "p.parquet"):
        out = os.path.join(tmp, "out_" + f)
        run_tool("--tokenizer", tj, "--pairs", "--seq-len", str(S), os.path.join(tmp, f), "--out", out, "--eval-frac",
                 "0.34", "--quiet")
        outs.append([open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))])
    assert len(outs[0]) == 2 and outs[0] == outs[1], "Parquet gives other shards than JSON lines (or no eval shard)"
    _, _, _, _ = read_pair_shard(os.path.join(tmp, "out_p.jsonl", "eval_000000.bin"))


def test_pairs_errors(tmp):
    """Bad rows end in one line naming file:line and what was expected."""
    _, tj = chat_tokenizer(tmp, CHATML)
    cases = [({"prompt": "q", "chosen": "a"}, "field 'rejected' is missing"),
             ({"prompt": "q", "chosen": None, "rejected": "b"}, "field 'chosen' is null"),
             ({"prompt": "q", "chosen": "", "rejected": "b"}, "field 'chosen' is an empty string"),
             ({"prompt": "q", "chosen": 3, "rejected": "b"}, "field 'chosen' is int 3"),
             ({"prompt": "q", "chosen": [{"role": "user", "content": "x"}], "rejected": "b"},
              "field 'chosen' ends with a 'user' turn"),
             (["q", "a", "b"], "expected an object with prompt, chosen and rejected")]
    for k, (row, msg) in enumerate(cases):
        src = os.path.join(tmp, f"bad{k}.jsonl")
        open(src, "w").write(json.dumps(ROWS[0]) + "\n" + json.dumps(row) + "\n")
        r = run_tool("--tokenizer", tj, "--pairs", "--seq-len", str(S), src, "--out", os.path.join(tmp, f"o{k}"),
                     "--quiet", ok=False)
        assert r.returncode != 0 and f"bad{k}.jsonl:2: {msg}" in r.stderr, f"case {k}: {r.stderr.strip()[-400:]}"
        assert "Traceback" not in r.stderr, r.stderr
    src = os.path.join(tmp, "long.jsonl")
    open(src, "w").write(json.dumps(ROWS[2]) + "\n")
    r = run_tool("--tokenizer", tj, "--pairs", "--seq-len", str(S), "--strict", src, "--out", os.path.join(tmp, "ol"),
                 "--quiet", ok=False)
    assert r.returncode != 0 and "long.jsonl:1: a sequence of the pair is longer than --seq-len" in r.stderr, r.stderr
    r = run_tool("--tokenizer", tj, "--pairs", src, "--out", os.path.join(tmp, "ox"), ok=False)
    assert r.returncode != 0 and "--pairs needs --seq-len" in r.stderr, r.stderr


def test_pairs_train_cli(tmp):
    """tokenize --pairs -> qtrain objective: dpo (LoRA) with eval: the console lines and the JSONL records carry the
    loss, rewards, margin and accuracy (step 1: loss log 2, margin 0, the adapters' B being 0); the same shards
    under objective: lm are refused naming data.train."""
    qtrain = os.path.join(ROOT, os.environ.get("BUILD", "build"), "qtrain")
    if not os.path.exists(qtrain):
        raise AssertionError(f"{qtrain} not built")
    _, tj = chat_tokenizer(tmp, CHATML)
    src = os.path.join(tmp, "p.jsonl")
    rows = [{"prompt": f"question {i}?", "chosen": f"answer {i} is yes", "rejected": "no"} for i in range(40)]
    open(src, "w").write("".join(json.dumps(r) + "\n" for r in rows))
    data = os.path.join(tmp, "data")
    run_tool("--tokenizer", tj, "--pairs", "--seq-len", str(S), src, "--out", data, "--eval-frac", "0.2", "--quiet")
    cfg = os.path.join(tmp, "run.yaml")
    open(cfg, "w").write(
        "device: cpu\nmodel: {vocab_size: 400, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
        "intermediate_size: 64, max_seq_len: 64}\n"
        f"data: {{train: '{data}/train_*.bin', seq_len: {S}, micro_batch: 4}}\n"
        "optim: {lr: 0.003, steps: 6, warmup: 1}\neval: {every: 3, batches: 2}\nlog: {every: 1}\n"
        f"run: {{dir: '{tmp}/run'}}\nlora: {{rank: 4}}\nobjective: dpo\ndpo: {{beta: 0.2}}\n")
    r = subprocess.run([qtrain, cfg], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    assert "step      1/6 | loss 0.6931 | margin 0.0000 | acc 0.000 | rewards 0.0000/0.0000 |" in r.stdout, r.stdout[-1500:]
    assert "eval      6/6 | loss " in r.stdout and "ppl" not in r.stdout.split("eval      6/6")[1].split("\n")[0], r.stdout
    recs = [json.loads(x) for x in open(os.path.join(tmp, "run", "log.jsonl"))]
    train = [x for x in recs if x["type"] == "train"]
    evals = [x for x in recs if x["type"] == "eval"]
    assert len(train) == 6 and len(evals) == 2, [x["type"] for x in recs]
    for x in train + evals:
        assert {"dpo_reward_chosen", "dpo_reward_rejected", "dpo_margin", "dpo_accuracy"} <= set(x), x
        assert abs(x["dpo_margin"] - (x["dpo_reward_chosen"] - x["dpo_reward_rejected"])) < 1e-5, x
    assert train[0]["dpo_pairs"] == 2 and evals[0]["dpo_pairs"] == 4, (train[0], evals[0])
    r = subprocess.run([qtrain, cfg, "--set", "objective=lm", "--set", f"run.dir={tmp}/run_lm"], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "data.train:" in r.stderr and "train them with objective: dpo" in r.stderr, r.stderr


def main():
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("SKIP test_tokenize_pairs: no numpy")
        return 0
    return run_tests(globals(), sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
