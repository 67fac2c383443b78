"""worker.py — runs in each worker process: parses a task (sources.py), tokenizes it and returns
arrays. A worker tokenizes on one thread (RAYON_NUM_THREADS=1, set before `tokenizers` is imported):
the parallelism is the worker processes, so parsing and id conversion scale with them too.

run(task) -> (tokens, mask or None, seg_lens, seg_ends, n_docs_skipped)
  tokens   uint32 array, all segments back to back; BOS (when the tokenizer config asks for it) before
           each document's first piece, EOS after its last
  mask     uint8 array (1 = trained on as a target) in --chat mode, else None
  seg_lens lengths of the segments; seg_ends[i] tells whether segment i ends its document (a text
           document cut into pieces spans several segments, maybe several tasks)"""
import json
import os

import numpy as np

S = {}  # this worker's state: the options, the tokenizer, the chat renderer


class WorkError(Exception):
    pass


def init(opts):
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    S.clear()
    S.update(opts)
    spec = opts["spec"]
    S["tok"] = None
    if spec is not None:
        from tokenizers import Tokenizer
        S["tok"] = Tokenizer.from_file(spec["path"])
        S["fast"] = getattr(S["tok"], "encode_batch_fast", S["tok"].encode_batch)
    if opts["chat"]:
        from .chat import Renderer
        S["render"] = Renderer(opts["chat_template"], spec["special"])


def _encode(texts):
    """ids lists of texts, no special tokens added."""
    if S["tok"] is None:
        return [list(t.encode("utf-8")) if isinstance(t, str) else list(t) for t in texts]
    return [e.ids for e in S["fast"](texts, add_special_tokens=False)]


def _docs(texts, starts, ends):
    ids = _encode(texts)
    bos, eos = S["bos_id"], S["eos_id"]
    out, lens = [], []
    for d, s, e in zip(ids, starts, ends):
        n = len(out)
        if s and bos is not None:
            out.append(bos)
        out += d
        if e and eos is not None:
            out.append(eos)
        lens.append(len(out) - n)
    return np.array(out, dtype=np.uint32), None, np.array(lens, dtype=np.int64), np.array(ends, dtype=bool)


def _chat(rows, where):
    from .chat import ChatError, messages_of
    tok, eos = S["tok"], S["eos_id"]
    toks, masks, lens = [], [], []
    for k, row in enumerate(rows):
        try:
            text, spans = S["render"](messages_of(row, S["messages_field"]))
        except ChatError as e:
            raise WorkError(f"{where(k)}: {e}")
        enc = tok.encode(text, add_special_tokens=False)
        ids = np.array(enc.ids, dtype=np.uint32)
        off = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)
        m = np.zeros(len(ids), dtype=np.uint8)
        for a, b in spans:  # tokens that overlap the span's characters
            m[(off[:, 0] < b) & (off[:, 1] > a)] = 1
        if eos is not None and (len(ids) == 0 or ids[-1] != eos):
            ids, m = np.append(ids, np.uint32(eos)), np.append(m, np.uint8(0))
        toks.append(ids)
        masks.append(m)
        lens.append(len(ids))
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
    return (cat(toks, np.uint32), cat(masks, np.uint8), np.array(lens, dtype=np.int64),
            np.ones(len(lens), dtype=bool))


def _text_of(v, where):
    if isinstance(v, str):
        return v
    raise WorkError(f"{where}: field {S['field']!r} is {type(v).__name__}, expected a string")


def run(task):
    kind, ref, payload = task
    if kind == "pieces":
        texts = [p[0] if S["tok"] is None else p[0].decode("utf-8", errors="replace") for p in payload]
        return _docs(texts, [p[1] for p in payload], [p[2] for p in payload])
    path, first = ref
    if kind == "jsonl":
        rows = []
        for k, line in enumerate(payload.split(b"\n")):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise WorkError(f"{path}:{first + k}: not valid JSON ({e})")
            if S["chat"]:
                rows.append((first + k, obj))
                continue
            if not isinstance(obj, dict) or S["field"] not in obj:
                have = ", ".join(sorted(obj)) if isinstance(obj, dict) else type(obj).__name__
                raise WorkError(f"{path}:{first + k}: no field {S['field']!r} (has {have}); "
                                "choose one with --field")
            rows.append((first + k, _text_of(obj[S["field"]], f"{path}:{first + k}")))
        where = (lambda i: f"{path}:{rows[i][0]}")
        vals = [r[1] for r in rows]
    else:
        vals = payload
        where = (lambda i: f"{path}: row {first + i}")
        if not S["chat"]:
            vals = [_text_of(v, where(i)) if v is not None else "" for i, v in enumerate(vals)]
    if S["chat"]:
        return _chat(vals, where)
    vals = [v for v in vals if v]  # an empty document gives nothing, not a lone EOS
    return _docs(vals, [True] * len(vals), [True] * len(vals))
