#!/usr/bin/env python3
"""tokenize_bench.py — tools/tokenize against HF tokenizers' own encode_batch, same machine, same data.

  python3 bench/tokenize_bench.py [--size-mb 300] [--workers N] [--dir DIR]

Needs python3, numpy and tokenizers only. Steps (files under $OUT/tokenize_bench, else --dir):
1. corpus.jsonl, --size-mb MB of {"text": ...} documents made from ../shared/data/tinyshakespeare.txt
   (or --source FILE): copy k shuffles the paragraphs with seed k, renames the speakers with a per-copy
   name table, upper- or lower-cases about one paragraph in ten, and cuts them into documents of 3 to 30
   paragraphs, each headed "Copy k, part j." — no two documents are the same.
2. tokenizer.json: a 32k byte-level BPE (GPT-2 pre-tokenizer, special <|endoftext|>) trained on the
   first --train-mb MB of the corpus; tokenizer_config.json names the EOS.
3. baseline: the corpus read and parsed outside the clock, then Tokenizer.encode_batch (and with
   --fast-baseline encode_batch_fast) on batches of 1,000 documents with all cores (Rayon); only the
   encode calls are timed.
4. tool: `tools/tokenize --tokenizer tokenizer.json corpus.jsonl --workers N`, the whole command timed
   (start-up, reading, parsing, tokenizing, writing shards with CRC-32).
Prints a table and writes it to results.md next to the data; MB are 10^6 bytes of corpus.jsonl text.
Wall time is the figure that counts; CPU seconds (all threads and processes) are printed too, as they
say more than wall time on a machine that other jobs share."""
import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ["ANNA", "BORIS", "CLEO", "DARIUS", "EDMUND", "FLAVIA", "GONZALO", "HERO", "IAGO", "JULIA", "KENT",
         "LAVINIA", "MARCUS", "NERISSA", "OBERON", "PORTIA", "QUINCE", "ROSALIND", "SILVIUS", "TITUS"]


def build_corpus(src, path, size):
    text = open(src, encoding="utf-8").read()
    paras = [p for p in text.split("\n\n") if p.strip()]
    speakers = sorted({m.group(1) for m in re.finditer(r"^([A-Z][A-Za-z ]+):$", text, re.M)})
    written, k = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size:
            rng = random.Random(k)
            table = {s: f"{rng.choice(NAMES).title()} {rng.choice(NAMES).title()}" for s in speakers}
            order = paras[:]
            rng.shuffle(order)
            i, part = 0, 0
            while i < len(order) and written < size:
                n = rng.randint(3, 30)
                body = []
                for p in order[i:i + n]:
                    p = re.sub(r"^([A-Z][A-Za-z ]+):$", lambda m: table.get(m.group(1), m.group(1)) + ":", p,
                               flags=re.M)
                    r = rng.random()
                    body.append(p.upper() if r < 0.05 else p.lower() if r < 0.1 else p)
                doc = f"Copy {k}, part {part}.\n\n" + "\n\n".join(body) + "\n"
                line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(line.encode("utf-8"))
                i, part = i + n, part + 1
            k += 1
    return written


def docs(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def train(corpus, out, train_bytes):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def sample():
        n = 0
        with open(corpus, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["text"]
                n += len(line)
                if n >= train_bytes:
                    return
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sample(), trainers.BpeTrainer(
        vocab_size=32000, show_progress=False, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({"eos_token": "<|endoftext|>"}, open(os.path.join(out, "tokenizer_config.json"), "w"))
    return tok


def cpu_seconds(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def baseline(tok, texts, method):
    fn = getattr(tok, method)
    t0, c0 = time.perf_counter(), cpu_seconds(resource.RUSAGE_SELF)
    n = 0
    for i in range(0, len(texts), 1000):
        for e in fn(texts[i:i + 1000], add_special_tokens=False):
            n += len(e.ids)
    return time.perf_counter() - t0, cpu_seconds(resource.RUSAGE_SELF) - c0, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=300)
    ap.add_argument("--train-mb", type=float, default=20)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--fast-baseline", action="store_true", help="also time encode_batch_fast")
    ap.add_argument("--source", default=os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt"))
    ap.add_argument("--dir", default=os.path.join(os.environ.get("OUT", os.path.join(ROOT, "out")), "tokenize_bench"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    corpus = os.path.join(a.dir, "corpus.jsonl")
    size = int(a.size_mb * 1e6)
    if not os.path.exists(corpus) or os.path.getsize(corpus) < size:
        t = time.time()
        build_corpus(a.source, corpus, size)
        print(f"corpus: {os.path.getsize(corpus) / 1e6:.0f} MB in {time.time() - t:.0f} s", flush=True)
    nbytes = os.path.getsize(corpus)
    from tokenizers import Tokenizer
    tj = os.path.join(a.dir, "tokenizer.json")
    if not os.path.exists(tj):
        t = time.time()
        train(corpus, a.dir, int(a.train_mb * 1e6))
        print(f"tokenizer: 32k BPE trained on {a.train_mb:.0f} MB in {time.time() - t:.0f} s", flush=True)
    tok = Tokenizer.from_file(tj)
    rows = []
    texts = docs(corpus)
    os.environ["RAYON_NUM_THREADS"] = str(a.workers)  # read when the thread pool starts (first encode)
    for method in ("encode_batch", "encode_batch_fast") if a.fast_baseline else ("encode_batch",):
        if hasattr(tok, method):
            el, cpu, n = baseline(tok, texts, method)
            rows.append((f"tokenizers {method} ({a.workers} threads)", el, cpu, n))
            print(f"{rows[-1][0]}: {el:.1f} s", flush=True)
    del texts
    out = os.path.join(a.dir, "shards")
    t0, c0 = time.perf_counter(), cpu_seconds(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tokenize"), "--tokenizer", tj, corpus, "--out",
                        out, "--workers", str(a.workers), "--quiet"], capture_output=True, text=True)
    el, cpu = time.perf_counter() - t0, cpu_seconds(resource.RUSAGE_CHILDREN) - c0
    if r.returncode != 0:
        sys.exit(f"tools/tokenize failed: {r.stderr}")
    n = int(re.search(r"tokens ([\d,]+)", r.stdout.splitlines()[-1]).group(1).replace(",", ""))
    rows.append((f"tools/tokenize --workers {a.workers} (whole command)", el, cpu, n))
    import tokenizers
    lines = [f"corpus {nbytes / 1e6:.0f} MB ({os.path.basename(corpus)}), 32k BPE, {os.cpu_count()} cores "
             f"visible, --workers {a.workers}, tokenizers {tokenizers.__version__}, load average "
             f"{os.getloadavg()[0]:.1f}", "",
             "| what | wall s | MB/s | Mtokens/s | vs encode_batch | CPU s | MB per CPU s |",
             "|---|---|---|---|---|---|---|"]
    base = rows[0][1]
    for name, el, cpu, n in rows:
        lines.append(f"| {name} | {el:.1f} | {nbytes / el / 1e6:.2f} | {n / el / 1e6:.3f} | {base / el:.2f}x | "
                     f"{cpu:.1f} | {nbytes / cpu / 1e6:.2f} |")
    print("\n".join(lines))
    open(os.path.join(a.dir, "results.md"), "w").write("\n".join(lines) + "\n")
    if n != rows[0][3] + sum(1 for _ in open(corpus)):  # the tool adds one EOS per document
        print(f"note: tool tokens {n:,} != encode_batch tokens + one EOS per document", file=sys.stderr)


if __name__ == "__main__":
    main()
