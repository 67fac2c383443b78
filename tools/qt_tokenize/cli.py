"""cli.py — the tools/tokenize command: inputs -> worker processes -> packer -> temporary token/mask
files -> shards (format version 3: tokens, loss mask, document starts). Output is the same whatever
--workers: tasks are cut from the input independently of the worker count and their results are
consumed in input order. At most 2 tasks per worker are in flight, so memory stays bounded whatever
the input size."""
import argparse
import collections
import contextlib
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from . import pack, shard, sources, tok, worker
from .chat import ChatError, Renderer

CHUNK_BYTES = 1 << 20


class Progress:
    """One status line on stderr (MB/s and ETA), rewritten at most twice a second."""

    def __init__(self, what, total, quiet):
        self.what, self.total, self.quiet = what, total, quiet
        self.t0 = self.last = time.time()

    def show(self, done, extra="", final=False):
        now = time.time()
        if self.quiet or (not final and now - self.last < 0.5):
            return
        self.last = now
        el = max(now - self.t0, 1e-9)
        pct = 100.0 * done / self.total if self.total else 100.0
        rate = done / el
        eta = (self.total - done) / rate if rate > 0 and done < self.total else 0
        tail = f", {el:.0f} s" if final else f", ETA {eta:.0f} s"
        end = "\n" if final else ""
        sys.stderr.write(f"\r{self.what}: {pct:5.1f}% ({done / 1e6:.1f} of {self.total / 1e6:.1f} MB, "
                         f"{rate / 1e6:.1f} MB/s{tail}){extra}   {end}")
        sys.stderr.flush()


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="tools/tokenize", description="Turn text, JSON lines, Parquet or `datasets` folders into "
        "qtrain token shards (format version 3; tools/README.md).")
    ap.add_argument("inputs", nargs="+", metavar="INPUT",
                    help="files, globs, directories or save_to_disk folders, read in the order given")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--byte-level", action="store_true", help="tokens are the raw UTF-8 bytes (vocab 256)")
    mode.add_argument("--tokenizer", metavar="JSON", help="a Hugging Face tokenizer.json (its folder's "
                      "tokenizer_config.json gives EOS, BOS and the chat template)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    ap.add_argument("--format", choices=["auto", "text", "jsonl", "parquet", "arrow"], default="auto",
                    help="input format (default: from each file's extension)")
    ap.add_argument("--field", default="text", help="JSON / Parquet / datasets field holding the text (default text)")
    ap.add_argument("--doc-sep", metavar="SEP", help="split text files into documents at SEP (Python "
                    "escapes allowed, e.g. '\\n\\n'); default: one document per file")
    ap.add_argument("--split", default="train", help="split of a saved DatasetDict (default train)")
    ap.add_argument("--eos-id", type=int, help="EOS token id after each document (default: the "
                    "tokenizer config's eos_token)")
    ap.add_argument("--no-eos", action="store_true", help="no EOS between documents")
    ap.add_argument("--chat", action="store_true", help="inputs are conversations: render them with the "
                    "chat template and write a loss mask that keeps only the assistant's tokens")
    ap.add_argument("--pairs", action="store_true", help="inputs are preference pairs (rows of prompt, chosen, "
                    "rejected: strings or message lists) for objective: dpo; each rendered with the chat template "
                    "(prompt as the user turn, the response as the assistant's reply) into a window of its own, "
                    "the mask on the response; needs --seq-len (a pair longer is dropped, counted)")
    ap.add_argument("--messages-field", default="messages", help="--chat: field of the message list")
    ap.add_argument("--chat-template", metavar="FILE", help="--chat: a Jinja template file instead of the tokenizer's")
    ap.add_argument("--tokenizer-config", metavar="JSON", help="tokenizer_config.json if not next to tokenizer.json")
    ap.add_argument("--seq-len", type=int, default=0, help="pack documents into windows of seq_len+1 "
                    "tokens, the trainer's (default 0: no packing)")
    ap.add_argument("--long", choices=["split", "drop"], default="split", help="with --seq-len: a "
                    "document longer than a window is split across windows or dropped (default split)")
    ap.add_argument("--pad-id", type=int, help="with --seq-len: the padding token (default the EOS id, else 0)")
    ap.add_argument("--eval-frac", type=float, default=0.05,
                    help="the last fraction of tokens (windows, when packing) goes to eval_* (default 0.05)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="at most this many tokens per shard")
    ap.add_argument("--zstd", action="store_true", help="write .bin.zst shards")
    ap.add_argument("--zstd-level", type=int, default=3, help="zstd level (default 3)")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                    help="worker processes (default: all cores, here %(default)s)")
    ap.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES, help="input bytes per task (default 1 MiB)")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ap.add_argument("--strict", action="store_true", help="a null or empty text (Parquet, Arrow, datasets, "
                    "JSON lines) or invalid UTF-8 (text files) is an error, not a counted warning")
    a = ap.parse_args(argv)
    if not 0 <= a.eval_frac < 1:
        ap.error(f"--eval-frac must be in [0, 1), got {a.eval_frac}")
    for name in ("chunk_bytes", "workers"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.shard_tokens < 2 or (a.seq_len and a.shard_tokens < a.seq_len + 1):
        ap.error(f"--shard-tokens must be >= 2 and >= seq_len+1, got {a.shard_tokens}")
    if a.seq_len < 0:
        ap.error(f"--seq-len must be >= 0, got {a.seq_len}")
    if (a.chat or a.pairs) and a.byte_level:
        ap.error(f"--{'pairs' if a.pairs else 'chat'} needs --tokenizer (a chat template and its tokens)")
    if a.pairs and (a.chat or a.seq_len < 1):
        ap.error("--pairs needs --seq-len N (each sequence gets a window of N tokens) and no --chat")
    if a.doc_sep is not None:
        # escapes such as \n or \x00 are decoded; other characters are kept as they are
        a.doc_sep = a.doc_sep.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("utf-8")
        if not a.doc_sep:
            ap.error("--doc-sep is empty")
    return ap, a


def setup(ap, a):
    """The tokenizer spec and the options the workers get."""
    if a.byte_level:
        spec, vocab, eos, bos = None, 256, None, None
    else:
        try:
            spec = tok.load(a.tokenizer, a.tokenizer_config, a.chat_template)
        except tok.TokError as e:
            sys.exit(f"tokenize: {e}")
        vocab, eos, bos = spec["vocab"], spec["eos_id"], spec["bos_id"] if spec["add_bos"] else None
    if a.eos_id is not None:
        if not 0 <= a.eos_id < vocab:
            ap.error(f"--eos-id {a.eos_id} is outside the vocab (size {vocab})")
        eos = a.eos_id
    if a.no_eos:
        eos = None
    elif eos is None and not a.byte_level:
        sys.exit(f"tokenize: {a.tokenizer}: no EOS token in tokenizer_config.json or special_tokens_map.json; "
                 "give --eos-id ID (or --no-eos)")
    if eos is None:
        print("tokenize: no EOS between documents" + (" (--no-eos)" if a.no_eos else " (byte-level: give --eos-id ID for one)"))
    else:
        name = spec["eos"] if spec and eos == spec["eos_id"] else None
        print(f"tokenize: EOS after each document: id {eos}" + (f" {name!r}" if name else "")
              + (" (--eos-id)" if a.eos_id is not None else " (the tokenizer's eos_token)"))
    pad = a.pad_id if a.pad_id is not None else (eos if eos is not None else 0)
    if not 0 <= pad < vocab:
        ap.error(f"--pad-id {pad} is outside the vocab (size {vocab})")
    if a.chat or a.pairs:  # checked here: a worker that fails to start would only break the pool
        try:
            Renderer(spec["chat_template"], spec["special"])
        except ChatError as e:
            sys.exit(f"tokenize: {a.chat_template or a.tokenizer}: {e}")
    opts = {"spec": spec, "chat": a.chat, "pairs": a.pairs, "seq_len": a.seq_len, "field": a.field, "messages_field": a.messages_field, "strict": a.strict,
            "eos_id": eos, "bos_id": bos, "chat_template": spec["chat_template"] if spec else None}
    src = {"chunk": a.chunk_bytes, "doc_sep": a.doc_sep, "field": a.field, "chat": a.chat, "pairs": a.pairs,
           "messages_field": a.messages_field, "split": a.split,
           "cut": "any" if a.byte_level else spec["cut"]}
    return vocab, pad, opts, src


class WorkerDied(worker.WorkError):
    """The pool broke (a worker killed, or out of memory): fail ends the process at once."""


_failed_threads = []  # the manager threads of the pools tokenize_all shut down without waiting


def fail(msg, tmps, at_once=False):
    """Ends the run with one line, msg, on stderr, the temporary files removed. Each pool shut down without
    waiting gets 10 s for its manager thread to end first: the interpreter's exit runs concurrent.futures'
    hook, which writes to that thread's wake-up pipe and can race its closing (a traceback after the message).
    at_once, or a thread still running then (it can wait for ever on a worker killed halfway through sending
    a result, or still starting), ends the process with os._exit."""
    for p in tmps:
        if p and os.path.exists(p):
            os.remove(p)
    print(f"tokenize: {msg}", file=sys.stderr, flush=True)
    threads = [t for t in _failed_threads if t is not None]
    for t in threads if not at_once else ():
        t.join(timeout=10)
    if at_once or any(t.is_alive() for t in threads):
        sys.stdout.flush()
        os._exit(1)
    sys.exit(1)


def tokenize_all(a, files, opts, src, packer):
    """Runs the tasks on the worker processes, results in input order into the packer. A worker that
    dies (killed, out of memory) breaks the pool and ends the run with an error, never a hang."""
    total = sources.input_bytes(files, a.split)
    prog = Progress("tokenize", total, a.quiet)
    tasks = sources.Tasks(files, src)
    ctx = multiprocessing.get_context("spawn")  # no fork: the tokenizers thread pool does not survive it
    pending = collections.deque()
    pool = ProcessPoolExecutor(a.workers, mp_context=ctx, initializer=worker.init, initargs=(opts,))

    workers = {}  # pid -> Process of every worker seen; none exits before the pool shuts down

    def note_workers():  # after each submit too: the pool starts its workers there, so each is seen alive
        workers.update((p.pid, p) for p in multiprocessing.active_children())

    def result(fut):
        # The pool's own check misses a worker killed halfway through sending a result larger than the
        # pipe (its manager thread then waits for ever on the rest of the message): the workers' exit
        # codes are read here as well, every half second while a result is awaited.
        while True:
            try:
                return fut.result(timeout=0.5)
            except FutureTimeout:
                note_workers()
                if any(p.exitcode is not None for p in workers.values()):
                    raise BrokenProcessPool from None

    def take():
        fut, done = pending.popleft()
        *arrays, notes = result(fut)
        packer.add(*arrays)
        for kind, (n, where) in notes.items():
            packer.notes.setdefault(kind, [0, where])[0] += n
        prog.show(done, f", {packer.sink.n:,} tokens")
    failed = True
    try:
        for task, done in tasks:
            pending.append((pool.submit(worker.run, task), done))
            note_workers()
            while len(pending) >= 2 * a.workers:
                take()
        while pending:
            take()
        failed = False
    except BrokenProcessPool:
        raise WorkerDied("a worker process died (killed, or out of memory?)")
    finally:
        # On any error (a dead worker, an input error raised in a worker, an interrupt) the workers are
        # killed, not waited for: one may still be starting, and a spawned worker left behind keeps the
        # caller's stdout open (a test harness reading it then never ends: seen in CI and in make test).
        if failed:
            for child in multiprocessing.active_children():
                child.kill()
            _failed_threads.append(getattr(pool, "_executor_manager_thread", None))  # shutdown drops the pool's reference
        pool.shutdown(wait=not failed, cancel_futures=True)
    packer.finish()
    prog.show(total, f", {packer.sink.n:,} tokens", final=True)


def main(argv=None):
    ap, a = parse_args(argv)
    try:
        files = sources.expand(a.inputs, a.format)
    except sources.InputError as e:
        ap.error(str(e))
    vocab, pad, opts, src = setup(ap, a)
    token_bytes = 2 if vocab <= 65536 else 4
    with_mask = a.chat or a.pairs or a.seq_len > 0
    os.makedirs(a.out, exist_ok=True)
    tmp_t = os.path.join(a.out, f".tokens.{os.getpid()}.tmp")
    tmp_m = os.path.join(a.out, f".mask.{os.getpid()}.tmp") if with_mask else None
    written = []
    try:
        sink = pack.Sink(tmp_t, tmp_m, token_bytes, vocab)
        packer = pack.PairPacker(sink, a.seq_len, pad) if a.pairs else pack.Packer(sink, a.seq_len, a.long, pad)
        try:
            tokenize_all(a, files, opts, src, packer)
        finally:
            sink.close()
        with contextlib.ExitStack() as files_open:
            tf = files_open.enter_context(open(tmp_t, "rb"))
            mf = files_open.enter_context(open(tmp_m, "rb")) if tmp_m else None
            index = {"train": 0, "eval": 0}
            docs = np.frombuffer(sink.docs, dtype=np.int64)
            plan = shard.plan_pairs if a.pairs else shard.plan
            for name, start, n in plan(sink.n, a.eval_frac, a.shard_tokens, a.seq_len):
                path = os.path.join(a.out, f"{name}_{index[name]:06d}.bin")
                index[name] += 1
                written.append((shard.write(path, tf, mf, docs, start, n, token_bytes, vocab,
                                            a.zstd_level if a.zstd else None, a.seq_len if a.pairs else 0), name, n))
    except WorkerDied as e:
        fail(e, (tmp_t, tmp_m), at_once=True)
    except (sources.InputError, worker.WorkError, ChatError, shard.ShardError, tok.TokError) as e:
        fail(e, (tmp_t, tmp_m))
    except OSError as e:
        fail(f"{e.filename or a.out}: {e.strerror or e}", (tmp_t, tmp_m))
    finally:
        for p in (tmp_t, tmp_m):
            if p and os.path.exists(p):
                os.remove(p)
    for path, _, n in written:
        print(f"{path}: {n:,} tokens")
    n_train = sum(n for _, name, n in written if name == "train")
    n_eval = sum(n for _, name, n in written if name == "eval")
    print(f"vocab_size {vocab}, token_bytes {token_bytes}, {n_train:,} train + {n_eval:,} eval tokens"
          + (f" (windows of {a.seq_len + 1}, neighbouring shards share one token)" if a.seq_len else ""))
    line = (f"pairs {packer.pairs:,}" if a.pairs else f"documents {packer.docs:,}") + f", tokens {sink.n:,}"
    if a.seq_len and not a.pairs:
        line += (f", padding {packer.pad_tokens:,}, split {packer.split_docs:,}, dropped "
                 f"{packer.dropped_docs:,} ({packer.dropped_tokens:,} tokens)")
    if with_mask:
        line += f", trained on {sink.ones / max(sink.n, 1):.1%} (masked out {1 - sink.ones / max(sink.n, 1):.1%})"
    count = {k: packer.notes.get(k, [0])[0] for k in worker.NOTES}
    line += f", skipped {count['null']:,} null + {count['empty']:,} empty rows, {count['utf8']:,} invalid UTF-8"
    print(line)
    for kind, (n, where) in sorted(packer.notes.items()):
        print(f"tokenize: warning: {n:,} {worker.NOTES[kind][1]}, the first at {where}; --strict makes "
              "this an error", file=sys.stderr)
