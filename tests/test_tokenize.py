#!/usr/bin/env python3
"""test_tokenize.py — tools/tokenize: shard format v3 (header, CRC-32, mask, document starts), token
ids equal to one HF `tokenizers` encode for every input format, cuts that change no token with a
tokenizer that merges whitespace runs (issue 29), the same bytes for any --workers, bounded memory,
chat loss masks, packing into windows and error messages. Prints PASS/FAIL/SKIP lines like the C
tests. test_tokenize_inputs.py and test_tokenize_docs.py hold the defective inputs and the document
starts."""
import gzip
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import zlib

from qt_test import ROOT, Skip, run_tests

TOOL = os.path.join(ROOT, "tools", "tokenize")
SHAKESPEARE = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATML_TAGGED = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
                 "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}\n{% else %}"
                 "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def run_tool(*args, ok=True, env=None):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, env=env)
    if ok and r.returncode != 0:
        raise AssertionError(f"tokenize {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def zstd_decompress(data):
    try:
        import zstandard
        return zstandard.ZstdDecompressor().stream_reader(data).read()
    except ImportError:
        if not shutil.which("zstd"):
            raise Skip("neither the zstandard module nor the zstd tool")
        return subprocess.run(["zstd", "-q", "-d", "-c"], input=data, capture_output=True, check=True).stdout


def zstd_compress(data):
    if not shutil.which("zstd"):
        raise Skip("no zstd tool")
    return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True).stdout


def read_shard(path):
    """Returns (header dict, tokens, mask or None) after checking the v3 layout and CRC-32; the header
    dict's "docs" holds the document starts."""
    data = open(path, "rb").read()
    if path.endswith(".zst"):
        data = zstd_decompress(data)
    assert data[:8] == b"QTTOKENS", f"{path}: magic {data[:8]!r}"
    ver, tb, n, vocab, flags, csum, n_docs = struct.unpack_from("<IIQIIQQ", data, 8)
    assert ver == 3 and tb in (2, 4) and flags in (2, 3), f"{path}: version {ver} token_bytes {tb} flags {flags}"
    assert data[48:64] == bytes(16), f"{path}: header padding not zero"
    payload = data[64:]
    nm = n if flags & 1 else 0
    assert len(payload) == n * tb + nm + 8 * n_docs, f"{path}: {len(payload)} payload bytes, n {n}"
    assert zlib.crc32(payload) == csum, f"{path}: CRC-32 mismatch"
    toks = list(struct.unpack(f"<{n}{'H' if tb == 2 else 'I'}", payload[:n * tb]))
    mask = list(payload[n * tb:n * tb + nm]) if flags & 1 else None
    docs = list(struct.unpack(f"<{n_docs}Q", payload[n * tb + nm:]))
    assert all(0 <= a < b for a, b in zip(docs, docs[1:])) and all(d < n for d in docs), f"{path}: document starts {docs}"
    assert all(t < vocab for t in toks), f"{path}: token >= vocab {vocab}"
    assert mask is None or set(mask) <= {0, 1}, f"{path}: mask bytes not 0/1"
    return {"token_bytes": tb, "n": n, "vocab": vocab, "flags": flags, "docs": docs}, toks, mask


def shards(d, prefix):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith(prefix))


def all_tokens(d):
    toks, masks = [], []
    for p in shards(d, "train_") + shards(d, "eval_"):
        _, t, m = read_shard(p)
        toks += t
        masks += m or []
    return toks, masks


def need_tokenizers():
    try:
        import tokenizers
        return tokenizers
    except ImportError:
        raise Skip("no tokenizers package")


def bpe_tokenizer(folder, text, vocab=400, specials=("<|eos|>",), config=None):
    """A small byte-level BPE trained on text, saved as folder/tokenizer.json (+ tokenizer_config.json)."""
    tk = need_tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    # trained on the lines too, so runs like "  \n" and "\r\n" that end a text become merges
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    tok.train_from_iterator([text] + text.splitlines(keepends=True), tk.trainers.BpeTrainer(
        vocab_size=vocab, show_progress=False, special_tokens=list(specials),
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    if config is not None:
        json.dump(config, open(os.path.join(folder, "tokenizer_config.json"), "w"))
    return tok, path


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


WS_TEXT = "".join(f"Speaker {i % 7}:  \nwell, {i} words\tand more\r\nthe end{' ' * (i % 9)}\n"
                  f"x{'  ' * (i % 4)}y\n\n  indented {i * 3}.   \r\n" for i in range(1500))


def test_byte_level_shakespeare(tmp):
    if not os.path.exists(SHAKESPEARE):
        raise Skip(f"{SHAKESPEARE} absent")
    text = open(SHAKESPEARE, "rb").read()
    run_tool("--byte-level", SHAKESPEARE, "--out", tmp, "--quiet")
    tr, ev = shards(tmp, "train_"), shards(tmp, "eval_")
    assert [os.path.basename(p) for p in tr + ev] == ["train_000000.bin", "eval_000000.bin"], tr + ev
    n_eval = round(len(text) * 0.05)
    h, t, m = read_shard(tr[0])
    he, te, _ = read_shard(ev[0])
    assert h["vocab"] == 256 and h["token_bytes"] == 2 and m is None, h
    assert h["n"] == len(text) - n_eval and he["n"] == n_eval, (h, he)
    assert os.path.getsize(tr[0]) == 64 + 2 * h["n"] + 8 * len(h["docs"]), "train file size"
    assert bytes(t) == text[:h["n"]] and bytes(te) == text[h["n"]:], "tokens are not the text's bytes"


def test_byte_level_zstd_shards(tmp):
    src = os.path.join(tmp, "in.txt")
    text = ("".join(f"line {i}: ünïcödé {i * i}\n" for i in range(3000))).encode()
    open(src, "wb").write(text)
    out = os.path.join(tmp, "out")
    run_tool("--byte-level", src, src, "--out", out, "--zstd", "--shard-tokens", "20000", "--eval-frac", "0.1",
             "--chunk-bytes", "5000", "--quiet")
    tr, ev = shards(out, "train_"), shards(out, "eval_")
    assert all(p.endswith(".bin.zst") for p in tr + ev), tr + ev
    sizes = [read_shard(p)[0]["n"] for p in tr + ev]
    toks, _ = all_tokens(out)
    assert bytes(toks) == text + text, "two inputs are not concatenated in order"
    assert sum(sizes[len(tr):]) == round(2 * len(text) * 0.1), sizes
    train_sizes = sizes[:len(tr)]
    assert max(train_sizes) <= 20000 and max(train_sizes) - min(train_sizes) <= 1, train_sizes
    assert not [f for f in os.listdir(out) if "tmp" in f], os.listdir(out)


def test_v3_header_crc_and_readme(tmp):
    """The header bytes of a masked shard, field by field, against the agreed v3 layout (one document
    at token 0); and the README still documents versions 1 and 2 next to version 3."""
    src = os.path.join(tmp, "in.txt")
    open(src, "wb").write(b"abcdefghij")
    run_tool("--byte-level", src, "--out", tmp, "--eval-frac", "0", "--seq-len", "4", "--quiet")
    data = open(os.path.join(tmp, "train_000000.bin"), "rb").read()
    toks = b"abcdefghij" + bytes(3)  # 10 tokens padded with token 0 to 3 windows of 5 = 13
    payload = b"".join(struct.pack("<H", c) for c in toks) + bytes([1] * 10 + [0] * 3) + bytes(8)
    want = (b"QTTOKENS" + struct.pack("<IIQIIQQ", 3, 2, 13, 256, 3, zlib.crc32(payload), 1) + bytes(16) + payload)
    assert data == want, f"v3 shard bytes differ:\n{data[:64].hex()}\n{want[:64].hex()}"
    readme = open(os.path.join(ROOT, "tools", "README.md")).read()
    for s in ("Token shard format (version 3)", "Token shard format (version 2)", "version 1", "FNV-1a 64",
              "CRC-32", "flags", "n_docs"):
        assert s in readme, f"tools/README.md lacks {s!r}"


def test_cut_with_whitespace_merges(tmp):
    """Issue 29: a tokenizer that merges whitespace runs ("  \\n" -> one token); the tool cuts every
    ~200 bytes; the ids must equal one encode of the whole document."""
    tok, tj = bpe_tokenizer(tmp, WS_TEXT, vocab=600)
    assert len(ids(tok, "  \n")) == 1 and len(ids(tok, "\r\n")) == 1, "test tokenizer does not merge whitespace"
    src = os.path.join(tmp, "in.txt")
    open(src, "w", newline="").write(WS_TEXT)
    want = ids(tok, WS_TEXT) + [tok.token_to_id("<|eos|>")]
    for chunk in ("200", "4096"):
        out = os.path.join(tmp, "out" + chunk)
        run_tool("--tokenizer", tj, src, "--out", out, "--chunk-bytes", chunk, "--eval-frac", "0", "--quiet")
        t, _ = all_tokens(out)
        diff = next((i for i, (a, b) in enumerate(zip(t, want)) if a != b), min(len(t), len(want)))
        assert t == want, f"chunk {chunk}: {len(t)} tokens vs one encode's {len(want)}, first difference at {diff}"


def test_hf_tokenizer_wide_vocab(tmp):
    tk = need_tokenizers()
    vocab = {f"w{i}": i for i in range(70000)}
    vocab["[UNK]"] = 70000
    tok = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    tj = os.path.join(tmp, "tokenizer.json")
    tok.save(tj)
    want = [(i * 7919) % 70001 for i in range(5000)]
    words = [f"w{i}" if i < 70000 else "zzz" for i in want]
    src = os.path.join(tmp, "in.txt")
    open(src, "w").write("\n".join(" ".join(words[j:j + 10]) for j in range(0, len(words), 10)) + "\n")
    out = os.path.join(tmp, "out")
    r = run_tool("--tokenizer", tj, src, "--out", out, "--chunk-bytes", "500", "--quiet", ok=False)
    assert r.returncode != 0 and "--eos-id" in r.stderr, "no EOS known: expected an error naming --eos-id"
    run_tool("--tokenizer", tj, src, "--out", out, "--chunk-bytes", "500", "--no-eos", "--quiet")
    h, _, _ = read_shard(shards(out, "train_")[0])
    assert h["token_bytes"] == 4 and h["vocab"] == 70001, h
    assert all_tokens(out)[0] == want, "4-byte tokens differ"


def test_says_which_eos(tmp):
    """The EOS placed after each document is named on stdout: its id, its text and where it came from."""
    tok, path = bpe_tokenizer(os.path.join(tmp, "tok"), "hello world\n" * 50, vocab=300,
                              specials=("<|endoftext|>",), config={"eos_token": "<|endoftext|>"})
    src = os.path.join(tmp, "in.txt")
    open(src, "w").write("hello world\n" * 20)
    eos = tok.token_to_id("<|endoftext|>")
    r = run_tool("--tokenizer", path, src, "--out", os.path.join(tmp, "a"), "--quiet")
    assert f"EOS after each document: id {eos} '<|endoftext|>' (the tokenizer's eos_token)" in r.stdout, r.stdout
    r = run_tool("--tokenizer", path, src, "--out", os.path.join(tmp, "b"), "--eos-id", "7", "--quiet")
    assert "EOS after each document: id 7 (--eos-id)" in r.stdout, r.stdout
    r = run_tool("--byte-level", src, "--out", os.path.join(tmp, "c"), "--quiet")
    assert "no EOS between documents (byte-level" in r.stdout, r.stdout


DOCS = [f"Document {i}: " + " ".join(f"word{j % 13} and  more\n" for j in range(i * 7 % 40 + 1)) +
        ("naïve café ✓\r\n" if i % 3 == 0 else "") for i in range(60)]


def formats_tokenizer(tmp):
    text = "\n".join(DOCS)
    return bpe_tokenizer(os.path.join(tmp, "tok"), text, vocab=500, specials=("<s>", "</s>"),
                         config={"eos_token": "</s>", "bos_token": {"content": "<s>"}, "add_bos_token": True})


def test_input_formats(tmp):
    """Every input format gives BOS + one encode + EOS per document, in order."""
    tok, tj = formats_tokenizer(tmp)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    want = [t for d in DOCS for t in [bos] + ids(tok, d) + [eos]]
    d = os.path.join(tmp, "in")
    os.makedirs(os.path.join(d, "sub"))
    for i, doc in enumerate(DOCS):  # a directory: one document per file, walked in sorted order
        open(os.path.join(d, "sub" if i >= 30 else "", f"{i:03d}.txt"), "w", newline="").write(doc)
    lines = "".join(json.dumps({"id": i, "text": doc}) + "\n" for i, doc in enumerate(DOCS)).encode()
    open(os.path.join(tmp, "c.jsonl"), "wb").write(lines)
    open(os.path.join(tmp, "c.jsonl.gz"), "wb").write(gzip.compress(lines))
    open(os.path.join(tmp, "body.jsonl"), "wb").write(
        "".join(json.dumps({"body": doc}) + "\n" for doc in DOCS).encode())
    sep = "\n<|doc|>\n"
    open(os.path.join(tmp, "sep.txt"), "w", newline="").write(sep.join(DOCS) + sep)
    cases = [("dir", [d]), ("glob", [os.path.join(d, "0*.txt"), os.path.join(d, "sub", "*.txt")]),
             ("jsonl", [os.path.join(tmp, "c.jsonl")]), ("jsonl.gz", [os.path.join(tmp, "c.jsonl.gz")]),
             ("field", [os.path.join(tmp, "body.jsonl"), "--field", "body"]),
             ("doc-sep", [os.path.join(tmp, "sep.txt"), "--doc-sep", "\\n<|doc|>\\n"])]
    if shutil.which("zstd"):
        open(os.path.join(tmp, "c.jsonl.zst"), "wb").write(zstd_compress(lines))
        cases.append(("jsonl.zst", [os.path.join(tmp, "c.jsonl.zst")]))
    for name, args in cases:
        out = os.path.join(tmp, "out-" + name)
        run_tool("--tokenizer", tj, *args, "--out", out, "--chunk-bytes", "300", "--quiet")
        assert all_tokens(out)[0] == want, f"{name}: ids differ from HF encode per document"
    out = os.path.join(tmp, "out-mixed")  # formats mixed: the order of the arguments is kept
    run_tool("--tokenizer", tj, os.path.join(d, "000.txt"), os.path.join(tmp, "c.jsonl"), os.path.join(d, "001.txt"),
             "--out", out, "--quiet")
    one = [[bos] + ids(tok, doc) + [eos] for doc in DOCS]
    assert all_tokens(out)[0] == one[0] + want + one[1], "text, JSON lines, text: order not kept"


def test_bos_from_post_processor(tmp):
    """No add_bos_token in the config but a TemplateProcessing post-processor that puts <s> first (as
    Llama 3's tokenizer.json does): BOS before each document, as encode(add_special_tokens=True)."""
    tk = need_tokenizers()
    tok, tj = bpe_tokenizer(os.path.join(tmp, "tok"), "\n".join(DOCS), vocab=500, specials=("<s>", "</s>"),
                            config={"eos_token": "</s>"})
    tok.post_processor = tk.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(tj)
    src = os.path.join(tmp, "c.jsonl")
    open(src, "w").write("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:5]))
    out = os.path.join(tmp, "out")
    run_tool("--tokenizer", tj, src, "--out", out, "--eval-frac", "0", "--quiet")
    want = [t for d in DOCS[:5] for t in tok.encode(d).ids + [tok.token_to_id("</s>")]]
    assert want[0] == 0 and all_tokens(out)[0] == want, "BOS of the post-processor not added"


def test_parquet_and_datasets(tmp):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise Skip("no pyarrow (pip install pyarrow)")
    tok, tj = formats_tokenizer(tmp)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    want = [t for d in DOCS for t in [bos] + ids(tok, d) + [eos]]
    table = pa.table({"n": list(range(len(DOCS))), "text": DOCS})
    pq.write_table(table, os.path.join(tmp, "c.parquet"), row_group_size=7)
    out = os.path.join(tmp, "out-pq")
    run_tool("--tokenizer", tj, os.path.join(tmp, "c.parquet"), "--out", out, "--chunk-bytes", "300", "--quiet")
    assert all_tokens(out)[0] == want, "parquet: ids differ"
    try:
        import datasets
    except ImportError:
        raise Skip("parquet passed; no `datasets` package for the save_to_disk folder")
    ds = os.path.join(tmp, "ds")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS}),
                          "test": datasets.Dataset.from_dict({"text": DOCS[:3]})}).save_to_disk(ds)
    for split, docs in (("train", DOCS), ("test", DOCS[:3])):
        out = os.path.join(tmp, "out-ds-" + split)
        run_tool("--tokenizer", tj, ds, "--split", split, "--out", out, "--quiet")
        assert all_tokens(out)[0] == [t for d in docs for t in [bos] + ids(tok, d) + [eos]], f"datasets {split}"


def test_missing_package_message(tmp):
    """Without pyarrow (Parquet), jinja2 (--chat) or tokenizers (--tokenizer): one line naming what to
    pip install. The packages are hidden by shadow modules that fail to import."""
    tok, tj = chat_tokenizer(tmp, CHATML)
    open(os.path.join(tmp, "x.parquet"), "wb").write(b"PAR1")
    open(os.path.join(tmp, "c.jsonl"), "w").write(json.dumps(chat_rows()[0]) + "\n")
    for pkg, args in (("pyarrow", [os.path.join(tmp, "x.parquet")]),
                      ("jinja2", ["--chat", os.path.join(tmp, "c.jsonl")]),
                      ("tokenizers", [os.path.join(tmp, "c.jsonl")])):
        shadow = os.path.join(tmp, "shadow-" + pkg)
        os.makedirs(os.path.join(shadow, pkg))
        open(os.path.join(shadow, pkg, "__init__.py"), "w").write("raise ImportError('hidden by the test')\n")
        env = dict(os.environ, PYTHONPATH=shadow)
        r = run_tool("--tokenizer", tj, *args, "--out", os.path.join(tmp, "out"), ok=False, env=env)
        assert r.returncode != 0 and r.stderr.strip().count("\n") == 0 and f"pip install {pkg}" in r.stderr, \
            (pkg, r.stderr)


def test_workers_same_bytes(tmp):
    tok, tj = bpe_tokenizer(tmp, WS_TEXT, vocab=600)
    src = os.path.join(tmp, "in.jsonl")
    open(src, "w").write("".join(json.dumps({"text": WS_TEXT[i:i + 777]}) + "\n" for i in range(0, len(WS_TEXT), 777)))
    outs = []
    for w in ("1", "3"):
        out = os.path.join(tmp, "out" + w)
        run_tool("--tokenizer", tj, src, "--out", out, "--chunk-bytes", "2000", "--workers", w,
                 "--seq-len", "64", "--shard-tokens", "3000", "--quiet")
        outs.append({f: open(os.path.join(out, f), "rb").read() for f in sorted(os.listdir(out))})
    assert len(outs[0]) > 3 and outs[0] == outs[1], f"--workers 1 and 3 differ: {sorted(outs[0])} {sorted(outs[1])}"


def test_bounded_memory(tmp):
    """A 16 MB one-document file (every line starts with a space, so only the space rule can cut), 64 KiB
    tasks: the largest process stays under 250 MB (one encode of the whole text takes far more)."""
    tok, tj = bpe_tokenizer(tmp, WS_TEXT, vocab=300)
    src = os.path.join(tmp, "big.txt")
    line = "".join(f" the quick{i % 10} brown fox jumps over {i}\n" for i in range(1000)).encode()
    with open(src, "wb") as f:
        for _ in range(16 * 1000 * 1000 // len(line)):
            f.write(line)
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    r = subprocess.run([sys.executable, "-c", code, sys.executable, TOOL, "--tokenizer", tj, src, "--out",
                        os.path.join(tmp, "out"), "--chunk-bytes", str(64 << 10), "--workers", "2", "--quiet",
                        "--no-eos"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    peak_mb = int(r.stdout.split()[-1]) / 1024
    assert peak_mb < 250, f"peak RSS {peak_mb:.0f} MB for a 16 MB input"
    print(f"  peak RSS {peak_mb:.0f} MB")


def chat_rows():
    return [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                      {"role": "assistant", "content": "Hello! How are you?"},
                      {"role": "user", "content": "Fine.\nAnd you?"}, {"role": "assistant", "content": "Well."}]},
        {"prompt": "Say yes", "completion": "yes"},
        {"instruction": "Add", "input": "1 2", "output": "3"},
        {"instruction": "Greet", "output": "hi all"},
    ]


def chat_tokenizer(tmp, template):
    text = "".join(f"<|im_start|>user\nquestion {i}?<|im_end|>\n<|im_start|>assistant\nanswer {i} is "
                   f"yes<|im_end|>\n" for i in range(200))
    return bpe_tokenizer(os.path.join(tmp, "tok"), text, vocab=400, specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                         config={"eos_token": "<|im_end|>", "chat_template": template})


def test_chat_masks_by_hand(tmp):
    """ChatML without generation tags: the mask is 1 exactly on the tokens of each reply and its
    "<|im_end|>\\n"; the four layouts; no EOS appended after a conversation that ends with it."""
    tok, tj = chat_tokenizer(tmp, CHATML)
    src = os.path.join(tmp, "c.jsonl")
    open(src, "w").write("".join(json.dumps(r) + "\n" for r in chat_rows()))
    out = os.path.join(tmp, "out")
    run_tool("--tokenizer", tj, "--chat", src, "--out", out, "--eval-frac", "0", "--quiet")
    got_t, got_m = all_tokens(out)
    turns = [[("system", "Be brief."), ("user", "Hi there"), ("assistant", "Hello! How are you?"),
              ("user", "Fine.\nAnd you?"), ("assistant", "Well.")],
             [("user", "Say yes"), ("assistant", "yes")], [("user", "Add\n\n1 2"), ("assistant", "3")],
             [("user", "Greet"), ("assistant", "hi all")]]
    want_t, want_m = [], []
    for conv in turns:
        for role, content in conv:
            head = ids(tok, f"<|im_start|>{role}\n")
            body = ids(tok, f"{content}<|im_end|>\n")
            want_t += head + body
            want_m += [0] * len(head) + [1 if role == "assistant" else 0] * len(body)
        # the rendering ends with "\n", not with EOS <|im_end|>: a separator EOS, mask 0
        want_t.append(tok.token_to_id("<|im_end|>"))
        want_m.append(0)
    assert got_t == want_t, "chat tokens differ from the hand-rendered ChatML"
    assert got_m == want_m, f"chat mask differs:\n{got_m}\n{want_m}"


def test_chat_masks_vs_transformers(tmp):
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise Skip("no transformers (pip install transformers); test_chat_masks_by_hand covers the masks")
    tok, tj = chat_tokenizer(tmp, CHATML_TAGGED)
    rows = [r for r in chat_rows() if "messages" in r] + [
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b c d"}]}]
    src = os.path.join(tmp, "c.jsonl")
    open(src, "w").write("".join(json.dumps(r) + "\n" for r in rows))
    out = os.path.join(tmp, "out")
    run_tool("--tokenizer", tj, "--chat", src, "--out", out, "--eval-frac", "0", "--quiet")
    got_t, got_m = all_tokens(out)
    hf = PreTrainedTokenizerFast(tokenizer_file=tj, eos_token="<|im_end|>")
    want_t, want_m = [], []
    for r in rows:
        o = hf.apply_chat_template(r["messages"], chat_template=CHATML_TAGGED, tokenize=True, return_dict=True,
                                   return_assistant_tokens_mask=True)
        eos = tok.token_to_id("<|im_end|>")
        sep = [] if o["input_ids"][-1] == eos else [eos]  # the tool separates conversations by one EOS
        want_t += list(o["input_ids"]) + sep
        want_m += list(o["assistant_masks"]) + [0] * len(sep)
    assert got_t == want_t, "chat tokens differ from transformers' apply_chat_template"
    assert got_m == want_m, f"mask differs from transformers':\n{got_m}\n{want_m}"


def test_chat_parquet_same_as_jsonl(tmp):
    """The same conversations from Parquet (messages as a list of structs, and prompt/completion columns)
    give the same tokens and mask as from JSON lines."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise Skip("no pyarrow (pip install pyarrow)")
    tok, tj = chat_tokenizer(tmp, CHATML)
    rows = chat_rows()
    outs = []
    for name in ("jsonl", "parquet"):
        src = [os.path.join(tmp, f"m.{name}"), os.path.join(tmp, f"p.{name}")]
        msgs, pc = [r for r in rows if "messages" in r], [r for r in rows if "prompt" in r]
        if name == "jsonl":
            open(src[0], "w").write("".join(json.dumps(r) + "\n" for r in msgs))
            open(src[1], "w").write("".join(json.dumps(r) + "\n" for r in pc))
        else:
            pq.write_table(pa.Table.from_pylist(msgs), src[0])
            pq.write_table(pa.Table.from_pylist(pc), src[1])
        out = os.path.join(tmp, "out-" + name)
        run_tool("--tokenizer", tj, "--chat", *src, "--out", out, "--quiet")
        outs.append(all_tokens(out))
    assert outs[0] == outs[1] and sum(outs[0][1]) > 0, "parquet conversations differ from JSON lines"


def test_packing(tmp):
    """Documents of 3, 10, 9, 17, 40 and 16 tokens (EOS included) in windows of 17 (seq_len 16), laid out
    by hand below: a document that does not fit what is left of its window starts the next one, pads
    and the token after them have mask 0, the 40-token one is dropped or split from a window start;
    shards hold whole windows and share their boundary token; the summary counts it all."""
    src = os.path.join(tmp, "in.txt")
    lens = [3, 10, 9, 17, 40, 16]
    docs = [bytes([65 + i] * (n - 1)) for i, n in enumerate(lens)]  # n-1 bytes + EOS = n tokens
    open(src, "wb").write(b"\x00".join(docs))
    E = 255

    def doc(i):
        return [65 + i] * (lens[i] - 1) + [E]
    pad = lambda k: [0] * k  # noqa: E731
    head = doc(0) + doc(1) + pad(3) + doc(2) + pad(7) + doc(3)          # positions 0..48
    want = {"drop": head + doc(5),                                        # 65 = 4 windows, doc 5 fills one
            "split": head + pad(15) + doc(4) + pad(8) + doc(5) + pad(1)}  # 129 = 8 windows
    for mode, toks_want in want.items():
        out = os.path.join(tmp, mode)
        r = run_tool("--byte-level", src, "--doc-sep", "\\x00", "--eos-id", "255", "--pad-id", "0", "--seq-len",
                     "16", "--long", mode, "--eval-frac", "0.25", "--shard-tokens", "40", "--out", out)
        parts = [read_shard(p) for p in shards(out, "train_") + shards(out, "eval_")]
        assert all(h["n"] in (17, 33) and h["flags"] == 3 for h, _, _ in parts), [h for h, _, _ in parts]
        toks, mask = parts[0][1], parts[0][2]
        for h, t, m in parts[1:]:
            assert t[0] == toks[-1] and m[0] == mask[-1], "neighbouring shards must share their boundary token"
            toks, mask = toks + t[1:], mask + m[1:]
        assert toks == toks_want, f"{mode}: layout\n{toks}\n{toks_want}"
        mask_want = [0 if t == 0 or (k and toks[k - 1] == 0) else 1 for k, t in enumerate(toks)]
        assert mask == mask_want, f"{mode}: mask\n{mask}\n{mask_want}"
        n_eval = round((len(toks) - 1) // 16 * 0.25) * 16 + 1
        assert sum(h["n"] for h, _, _ in parts[len(shards(out, "train_")):]) == n_eval, "eval windows"
        summary = r.stdout.splitlines()[-1]
        expect = (f"documents {5 if mode == 'drop' else 6}, tokens {len(toks)}, padding {toks.count(0)}, "
                  f"split {0 if mode == 'drop' else 1}, dropped {1 if mode == 'drop' else 0} "
                  f"({40 if mode == 'drop' else 0} tokens)")
        assert summary.startswith(expect), f"summary {summary!r}, expected {expect!r}"


def killed_workers_end_the_run(tmp, mid_write):
    """Starts the tool on 2 workers, kills them and expects an error naming the cause within 120 s. With
    mid_write the tool is stopped first (SIGSTOP) until a worker blocks halfway through writing a result
    larger than the pipe, and that worker is killed there: the pool's manager thread then waits for ever
    on the rest of the message, so only the tool's own watch on the workers ends the run."""
    import signal
    import time
    tok, tj = bpe_tokenizer(tmp, WS_TEXT, vocab=300)
    src = os.path.join(tmp, "big.txt")
    open(src, "w").write(WS_TEXT * 200)
    p = subprocess.Popen([sys.executable, TOOL, "--tokenizer", tj, src, "--out", os.path.join(tmp, "out"),
                          "--workers", "2", "--chunk-bytes", "262144" if mid_write else "65536", "--quiet"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # its own group: a hung tool is killed with its workers

    def workers():
        try:
            kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
        except OSError:
            raise Skip("no /proc children list")
        found = []
        for k in kids:
            try:
                if b"spawn_main" in open(f"/proc/{k}/cmdline", "rb").read():
                    found.append(int(k))
            except OSError:
                pass
        return found

    def wchan(pid):
        try:
            return open(f"/proc/{pid}/wchan").read()
        except OSError:
            return ""
    t0 = time.time()
    while len(workers()) < 2 and time.time() - t0 < 30 and p.poll() is None:
        time.sleep(0.2)
    assert workers(), "no worker process seen"
    time.sleep(1.0)
    if mid_write:
        os.kill(p.pid, signal.SIGSTOP)
        t0 = time.time()
        while not any("pipe_write" in wchan(w) for w in workers()) and time.time() - t0 < 30:
            time.sleep(0.2)
        writing = [w for w in workers() if "pipe_write" in wchan(w)]
        if not writing and not any(wchan(w) for w in workers()):
            os.kill(p.pid, signal.SIGCONT)
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise Skip("no /proc/PID/wchan: a worker blocked in a pipe write cannot be seen")
        assert writing, "no worker blocked writing its result in 30 s"
        victims = workers()
    else:
        victims = workers()[:1]
    for w in victims:
        os.kill(w, signal.SIGKILL)
    if mid_write:
        os.kill(p.pid, signal.SIGCONT)
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # workers left behind would hold the harness's stdout open
        p.communicate()
        raise AssertionError("the tool hung after a worker was killed")
    assert p.returncode != 0 and "worker process died" in err, (p.returncode, err)


def test_killed_worker_ends_the_run(tmp):
    """A worker killed mid-run (as the OOM killer would) ends the run with an error, not a hang."""
    killed_workers_end_the_run(tmp, mid_write=False)


def test_worker_killed_mid_write_ends_the_run(tmp):
    """A worker killed halfway through sending its result ends the run with an error, not a hang."""
    killed_workers_end_the_run(tmp, mid_write=True)


def test_argument_errors(tmp):
    r = run_tool("--byte-level", os.path.join(tmp, "missing.txt"), "--out", tmp, ok=False)
    assert r.returncode != 0 and "missing.txt: no such file" in r.stderr, r.stderr
    src = os.path.join(tmp, "in.txt")
    open(src, "w").write("abc")
    r = run_tool("--byte-level", src, "--out", tmp, "--eval-frac", "1.5", ok=False)
    assert r.returncode != 0 and "--eval-frac" in r.stderr, r.stderr
    r = run_tool(src, "--out", tmp, ok=False)
    assert r.returncode != 0 and "--byte-level" in r.stderr, r.stderr
    bad = os.path.join(tmp, "bad.jsonl")
    open(bad, "w").write('{"text": "a"}\n' + "\n" * 300 + '{"txt": "b"}\n')  # blank lines are counted
    r = run_tool("--byte-level", bad, "--out", tmp, "--chunk-bytes", "16", ok=False)
    assert r.returncode != 0 and "bad.jsonl:302: no field 'text'" in r.stderr, r.stderr
    open(bad, "w").write('{"messages": [{"role": "user"}]}\n')
    r = run_tool("--tokenizer", chat_tokenizer(tmp, CHATML)[1], "--chat", bad, "--out", tmp, ok=False)
    assert r.returncode != 0 and "bad.jsonl:1: message 0: expected {role, content: string}" in r.stderr, r.stderr
    tok, tj = bpe_tokenizer(os.path.join(tmp, "plain"), "some text", specials=("<|eos|>",))
    r = run_tool("--tokenizer", tj, "--chat", bad, "--out", tmp, ok=False)
    assert r.returncode != 0 and "has no chat_template" in r.stderr, r.stderr


def main():
    try:
        import numpy  # noqa: F401 — tools/tokenize needs it
    except ImportError:
        print("SKIP test_tokenize: no numpy (pip install numpy)")
        return 0
    return run_tests(globals(), sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
