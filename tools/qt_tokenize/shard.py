"""shard.py — writes qtrain token shards, format version 3 (tools/README.md, "Token shard format").

header, 64 bytes: magic "QTTOKENS" | u32 version 3 | u32 token_bytes | u64 n_tokens | u32 vocab_size
                  (largest id + 1) | u32 flags (bit 0: a loss mask follows the tokens; bit 1: document
                  starts follow) | u64 CRC-32 of the payload | u64 n_docs | 16 zero
payload: n_tokens tokens (u16/u32 little-endian), then, if flags & 1, n_tokens mask bytes (0 or 1),
then, if flags & 2, n_docs u64 indices of the tokens that begin a document (increasing, < n_tokens).
The CRC is zlib.crc32 (IEEE, initial 0) over all payload bytes, zero-extended to 64 bits.
Version 4 (--pairs): flags bit 2 (preference pairs) and u32 pair_seq_len S at byte 48; the shard holds 2 P windows
of S + 1 tokens at stride S (2 P S + 1 tokens), window 2p pair p's chosen sequence and 2p + 1 its rejected one."""
import os
import shutil
import struct
import subprocess
import zlib

import numpy as np

MAGIC = b"QTTOKENS"
VERSION = 3
HEADER_BYTES = 64
FLAG_MASK = 1
FLAG_DOCS = 2
FLAG_PAIRS = 4
COPY_BYTES = 1 << 22


class ShardError(Exception):
    pass


def header(token_bytes, n_tokens, vocab_size, flags, crc, n_docs, pair_seq_len=0):
    version = 4 if pair_seq_len else VERSION
    h = MAGIC + struct.pack("<IIQIIQQ", version, token_bytes, n_tokens, vocab_size, flags, crc, n_docs)
    if pair_seq_len:
        h += struct.pack("<I", pair_seq_len)
    return h + bytes(HEADER_BYTES - len(h))


def plan_pairs(n_tokens, eval_frac, shard_tokens, seq_len):
    """plan() for a pair stream (2 P seq_len + 1 tokens): whole pairs to shards, the last round(P * eval_frac) to
    eval; a shard of p pairs holds 2 p seq_len + 1 tokens."""
    pairs = (n_tokens - 1) // (2 * seq_len) if n_tokens else 0
    p_eval = int(round(pairs * eval_frac))
    per = max(1, (shard_tokens - 1) // (2 * seq_len))
    out, p0 = [], 0
    for name, count in (("train", pairs - p_eval), ("eval", p_eval)):
        for p in split(count, per):
            out.append((name, p0 * 2 * seq_len, p * 2 * seq_len + 1))
            p0 += p
    return out


def split(n, max_per):
    """n items cut into the fewest pieces of <= max_per items, of nearly equal size (so no tiny tail
    shard is shorter than a training window)."""
    if n == 0:
        return []
    k = -(-n // max_per)
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def plan(n_tokens, eval_frac, shard_tokens, seq_len):
    """Returns [(split name, first token, token count)] for the whole token stream.

    Unpacked: the last round(n * eval_frac) tokens are eval; shards do not overlap.
    Packed (seq_len > 0, n = W * seq_len + 1): whole windows go to shards; a shard of w windows holds
    w * seq_len + 1 tokens, so neighbouring shards share one token and the loader's windows (stride
    seq_len) are exactly the packer's."""
    out = []
    if not seq_len:
        n_eval = int(round(n_tokens * eval_frac))
        start = 0
        for name, count in (("train", n_tokens - n_eval), ("eval", n_eval)):
            for m in split(count, shard_tokens):
                out.append((name, start, m))
                start += m
        return out
    windows = (n_tokens - 1) // seq_len if n_tokens else 0
    w_eval = int(round(windows * eval_frac))
    per = max(1, (shard_tokens - 1) // seq_len)
    w0 = 0
    for name, count in (("train", windows - w_eval), ("eval", w_eval)):
        for w in split(count, per):
            out.append((name, w0 * seq_len, w * seq_len + 1))
            w0 += w
    return out


def _copy(src, dst, offset, nbytes, crc):
    src.seek(offset)
    while nbytes:
        data = src.read(min(nbytes, COPY_BYTES))
        if not data:
            raise ShardError(f"{src.name}: temporary file ended early")
        crc = zlib.crc32(data, crc)
        dst.write(data)
        nbytes -= len(data)
    return crc


def write(path, tokens_f, mask_f, docs, start, n, token_bytes, vocab, zstd_level=None, pair_seq_len=0):
    """Writes tokens [start, start+n) of the raw token file (and the same range of the raw mask file
    when mask_f is not None) as one shard at path (+ ".zst" when zstd_level is set), atomically, with
    the document starts of that range (docs: the stream's, sorted int64); pair_seq_len > 0: a version 4 pair
    shard."""
    bin_path = path + ".tmp" if zstd_level is not None else path
    tmp = bin_path + ".part"
    lo, hi = np.searchsorted(docs, [start, start + n])
    starts = (docs[lo:hi] - start).astype("<u8").tobytes()
    with open(tmp, "wb") as out:
        out.write(bytes(HEADER_BYTES))
        crc = _copy(tokens_f, out, start * token_bytes, n * token_bytes, 0)
        if mask_f is not None:
            crc = _copy(mask_f, out, start, n, crc)
        out.write(starts)
        crc = zlib.crc32(starts, crc)
        out.seek(0)
        flags = (FLAG_MASK if mask_f is not None else 0) | FLAG_DOCS | (FLAG_PAIRS if pair_seq_len else 0)
        out.write(header(token_bytes, n, vocab, flags, crc, int(hi - lo), pair_seq_len))
    os.replace(tmp, bin_path)
    if zstd_level is not None:
        compress(bin_path, path + ".zst", zstd_level)
        os.remove(bin_path)
    return path + (".zst" if zstd_level is not None else "")


def compress(bin_path, zst_path, level):
    tmp = zst_path + ".tmp"
    try:
        import zstandard
        with open(bin_path, "rb") as src, open(tmp, "wb") as dst:
            zstandard.ZstdCompressor(level=level).copy_stream(src, dst)
    except ImportError:
        if not shutil.which("zstd"):
            raise ShardError("--zstd needs the Python `zstandard` module (pip install zstandard) or the "
                             "`zstd` command-line tool")
        subprocess.run(["zstd", "-q", "-f", f"-{level}", "-o", tmp, bin_path], check=True)
    os.replace(tmp, zst_path)
