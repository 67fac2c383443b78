#!/usr/bin/env python3
"""test_tokenize.py — tools/tokenize: byte-level shards of tinyshakespeare, zstd shards, a Hugging Face
tokenizer (2- and 4-byte tokens, chunking that changes no token) and argument errors. Prints PASS/FAIL/
SKIP lines like the C tests."""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "tokenize")
SHAKESPEARE = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt")
failed = 0


class Skip(Exception):
    pass


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def run_tool(*args, ok=True):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
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


def read_shard(path):
    """Returns (header dict, token list) after checking the layout and checksum."""
    data = open(path, "rb").read()
    if path.endswith(".zst"):
        data = zstd_decompress(data)
    assert data[:8] == b"QTTOKENS", f"{path}: magic {data[:8]!r}"
    ver, tb, n, vocab, res, csum = struct.unpack_from("<IIQIIQ", data, 8)
    assert ver == 1 and tb in (2, 4) and res == 0, f"{path}: version {ver} token_bytes {tb} reserved {res}"
    assert data[40:64] == bytes(24), f"{path}: header padding not zero"
    payload = data[64:]
    assert len(payload) == n * tb, f"{path}: {len(payload)} payload bytes, header says {n} x {tb}"
    assert fnv1a64(payload) == csum, f"{path}: checksum mismatch"
    toks = list(struct.unpack(f"<{n}{'H' if tb == 2 else 'I'}", payload))
    assert all(t < vocab for t in toks), f"{path}: token >= vocab {vocab}"
    return {"token_bytes": tb, "n": n, "vocab": vocab}, toks


def shards(d, prefix):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith(prefix))


def test_byte_level_shakespeare(tmp):
    if not os.path.exists(SHAKESPEARE):
        raise Skip(f"{SHAKESPEARE} absent")
    text = open(SHAKESPEARE, "rb").read()
    run_tool("--byte-level", SHAKESPEARE, "--out", tmp, "--quiet")
    tr, ev = shards(tmp, "train_"), shards(tmp, "eval_")
    assert [os.path.basename(p) for p in tr + ev] == ["train_000000.bin", "eval_000000.bin"], tr + ev
    n_eval = round(len(text) * 0.05)
    h, t = read_shard(tr[0])
    he, te = read_shard(ev[0])
    assert h["vocab"] == 256 and h["token_bytes"] == 2, h
    assert h["n"] == len(text) - n_eval and he["n"] == n_eval, (h, he)
    assert os.path.getsize(tr[0]) == 64 + 2 * h["n"], "train file size"
    assert bytes(t) == text[:h["n"]] and bytes(te) == text[h["n"]:], "tokens are not the text's bytes"


def test_byte_level_zstd_shards(tmp):
    src = os.path.join(tmp, "in.txt")
    text = ("".join(f"line {i}: ünïcödé {i * i}\n" for i in range(3000))).encode()
    open(src, "wb").write(text)
    out = os.path.join(tmp, "out")
    run_tool("--byte-level", src, src, "--out", out, "--zstd", "--shard-tokens", "20000", "--eval-frac", "0.1",
             "--quiet")
    tr, ev = shards(out, "train_"), shards(out, "eval_")
    assert all(p.endswith(".bin.zst") for p in tr + ev), tr + ev
    toks = []
    sizes = []
    for p in tr + ev:
        h, t = read_shard(p)
        toks += t
        sizes.append(h["n"])
    assert bytes(toks) == text + text, "two inputs are not concatenated in order"
    n_eval = round(2 * len(text) * 0.1)
    train_sizes = sizes[:len(tr)]
    assert sum(sizes[len(tr):]) == n_eval, (sizes, n_eval)
    assert max(train_sizes) <= 20000 and max(train_sizes) - min(train_sizes) <= 1, train_sizes
    assert not [f for f in os.listdir(out) if "tmp" in f], os.listdir(out)


def bpe_tokenizer(path, text):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise Skip("no tokenizers package")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=["<|eos|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)
    return tok


def test_hf_tokenizer_chunking(tmp):
    text = "".join(f"Speaker {i % 7}:\n  well, {i} words\tand more\n\nthe end {i * 3}.\n" for i in range(2000))
    tj = os.path.join(tmp, "tokenizer.json")
    tok = bpe_tokenizer(tj, text)
    src = os.path.join(tmp, "in.txt")
    open(src, "w").write(text)
    out = os.path.join(tmp, "out")
    eos = tok.token_to_id("<|eos|>")
    run_tool("--tokenizer", tj, src, "--out", out, "--chunk-bytes", "1000", "--eval-frac", "0", "--eos-id",
             str(eos), "--quiet")
    assert shards(out, "eval_") == [], "eval shards written with --eval-frac 0"
    h, t = read_shard(shards(out, "train_")[0])
    want = tok.encode(text, add_special_tokens=False).ids + [eos]
    assert h["vocab"] == tok.get_vocab_size() and h["token_bytes"] == 2, h
    assert t == want, f"chunked tokens differ from one encode ({len(t)} vs {len(want)})"


def test_hf_tokenizer_wide_vocab(tmp):
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:
        raise Skip("no tokenizers package")
    vocab = {f"w{i}": i for i in range(70000)}
    vocab["[UNK]"] = 70000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tj = os.path.join(tmp, "tokenizer.json")
    tok.save(tj)
    ids = [(i * 7919) % 70001 for i in range(5000)]
    words = [f"w{i}" if i < 70000 else "zzz" for i in ids]
    src = os.path.join(tmp, "in.txt")
    open(src, "w").write("\n".join(" ".join(words[j:j + 10]) for j in range(0, len(words), 10)) + "\n")
    out = os.path.join(tmp, "out")
    run_tool("--tokenizer", tj, src, "--out", out, "--chunk-bytes", "500", "--quiet")
    t = []
    for p in shards(out, "train_") + shards(out, "eval_"):
        h, part = read_shard(p)
        assert h["token_bytes"] == 4 and h["vocab"] == 70001, h
        t += part
    assert t == ids, "4-byte tokens differ"


def test_argument_errors(tmp):
    r = run_tool("--byte-level", os.path.join(tmp, "missing.txt"), "--out", tmp, ok=False)
    assert r.returncode != 0 and "missing.txt: no such file" in r.stderr, r.stderr
    src = os.path.join(tmp, "in.txt")
    open(src, "w").write("abc")
    r = run_tool("--byte-level", src, "--out", tmp, "--eval-frac", "1.5", ok=False)
    assert r.returncode != 0 and "--eval-frac" in r.stderr, r.stderr
    r = run_tool(src, "--out", tmp, ok=False)
    assert r.returncode != 0 and "--byte-level" in r.stderr, r.stderr


def main():
    global failed
    for name, fn in list(globals().items()):
        if not name.startswith("test_") or not callable(fn):
            continue
        tmp = tempfile.mkdtemp(prefix="qt_tok_")
        try:
            fn(tmp)
            print(f"PASS {name}")
        except Skip as e:
            print(f"SKIP {name}: {e}")
        except Exception as e:  # noqa: BLE001 — any error is this test's failure
            failed += 1
            print(f"FAIL {name}: {e}")
            traceback.print_exc(limit=3, file=sys.stdout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
