"""worker.py — runs in each worker process: parses a task (sources.py), tokenizes it and returns
arrays. A worker tokenizes on one thread (RAYON_NUM_THREADS=1, set before `tokenizers` is imported):
the parallelism is the worker processes, so parsing and id conversion scale with them too.

run(task) -> (tokens, mask or None, seg_lens, seg_ends, notes)
  tokens   uint32 array, all segments back to back; BOS (when the tokenizer config asks for it) before
           each document's first piece, EOS after its last
  mask     uint8 array (1 = trained on as a target) in --chat and --pairs mode, else None
  seg_lens lengths of the segments (--pairs: the chosen and the rejected sequence of each pair, in turn); seg_ends[i] tells whether segment i ends its document (a text
           document cut into pieces spans several segments, maybe several tasks)
  notes    {kind: [count, where of the first]} of the inputs skipped or repaired (NOTES); with --strict
           the first one is an error instead

Every failure ends as a WorkError naming the file and line (JSON lines, text) or row (Parquet, Arrow)."""
import json
import os

import numpy as np

NL = b"\n"
S = {}  # this worker's state: the options, the tokenizer, the chat renderer
NOTES = {"null": ("the field is null", "null values (rows skipped)"),
         "empty": ("the field is an empty string", "empty texts (rows skipped)"),
         "utf8": ("invalid UTF-8", "invalid UTF-8 sequences (each read as U+FFFD)"),
         "long": ("a sequence of the pair is longer than --seq-len", "preference pairs longer than --seq-len (dropped)")}


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
    if opts["chat"] or opts.get("pairs"):
        from .chat import Renderer
        S["render"] = Renderer(opts["chat_template"], spec["special"])


def _encode(texts):
    """ids lists of texts, no special tokens added."""
    if S["tok"] is None:
        return [list(t.encode("utf-8")) if isinstance(t, str) else list(t) for t in texts]
    return [e.ids for e in S["fast"](texts, add_special_tokens=False)]


def note(notes, kind, where):
    """Counts one skipped or repaired input; with --strict it is an error."""
    if S.get("strict"):
        raise WorkError(f"{where}: {NOTES[kind][0]} (an error with --strict)")
    notes.setdefault(kind, [0, where])[0] += 1


def _bad_text(texts, wheres):
    """The WorkError for the first text the tokenizer cannot take (a lone surrogate such as "\\ud800"
    from JSON is a str, but no Unicode text)."""
    for t, w in zip(texts, wheres):
        if isinstance(t, str):
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as e:
                return WorkError(f"{w}: the text holds {t[e.start]!r} at character {e.start}, a lone surrogate "
                                 "(no Unicode character; JSON writes it as \\ud800-\\udfff without its pair)")
    return None


def _docs(texts, starts, ends, wheres):
    try:
        ids = _encode(texts)
    except Exception:  # noqa: BLE001 — tokenizers raises TypeError for text it cannot take
        raise _bad_text(texts, wheres) or WorkError(f"{wheres[0] if wheres else '?'}: the tokenizer failed") from None
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


def _conversation(msgs, where, last=None):
    """A conversation's tokens and mask (1 on the assistant's turns; last: on its last `last` turns only), EOS
    appended (mask 0) when the rendering does not end with it."""
    from .chat import ChatError
    tok, eos = S["tok"], S["eos_id"]
    try:
        text, spans = S["render"](msgs)
    except ChatError as e:
        raise WorkError(f"{where}: {e}")
    try:
        enc = tok.encode(text, add_special_tokens=False)
    except Exception:  # noqa: BLE001 — see _bad_text
        raise _bad_text([text], [where]) or WorkError(f"{where}: the tokenizer failed") from None
    ids = np.array(enc.ids, dtype=np.uint32)
    off = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)
    m = np.zeros(len(ids), dtype=np.uint8)
    for a, b in spans[-last:] if last else spans:  # tokens that overlap the span's characters
        m[(off[:, 0] < b) & (off[:, 1] > a)] = 1
    if eos is not None and (len(ids) == 0 or ids[-1] != eos):
        ids, m = np.append(ids, np.uint32(eos)), np.append(m, np.uint8(0))
    return ids, m


def _chat(rows, where):
    from .chat import ChatError, messages_of
    seqs = []
    for k, row in enumerate(rows):
        try:
            msgs = messages_of(row, S["messages_field"])
        except ChatError as e:
            raise WorkError(f"{where(k)}: {e}")
        seqs.append(_conversation(msgs, where(k)))
    return _segments(seqs)


def _segments(seqs):
    """[(tokens, mask)] of whole documents -> run()'s arrays."""
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
    return (cat([t for t, _ in seqs], np.uint32), cat([m for _, m in seqs], np.uint8),
            np.array([len(t) for t, _ in seqs], dtype=np.int64), np.ones(len(seqs), dtype=bool))


def _pair_turns(row, key, where):
    """Field `key` of a preference row as messages: a string is one turn (the user's for the prompt, the
    assistant's for a response); a list is [{role, content}, ...] as it is (TRL's conversational format)."""
    v = row.get(key)
    role = "user" if key == "prompt" else "assistant"
    if isinstance(v, str):
        if not v and key != "prompt":
            raise WorkError(f"{where}: field {key!r} is an empty string (expected the {key} response)")
        return [{"role": role, "content": v}]
    if isinstance(v, list) and v and all(isinstance(m, dict) and isinstance(m.get("role"), str) and
                                         isinstance(m.get("content"), str) for m in v):
        if key != "prompt" and v[-1]["role"] != "assistant":
            raise WorkError(f"{where}: field {key!r} ends with a {v[-1]['role']!r} turn (expected the assistant's)")
        return v
    got = "missing" if key not in row else "null" if v is None else f"{type(v).__name__} {json.dumps(v)[:60]}"
    raise WorkError(f"{where}: field {key!r} is {got} (expected a string or a list of {{role, content}} messages)")


def _pairs(rows, where, notes):
    """Preference rows {prompt, chosen, rejected} -> the chosen and the rejected conversation of each pair, back to
    back (two segments per pair, each a document), the mask on the response's turns only. A pair whose sequence
    is longer than seq_len tokens is dropped (counted; an error with --strict)."""
    seqs = []
    for k, row in enumerate(rows):
        if not isinstance(row, dict):
            raise WorkError(f"{where(k)}: expected an object with prompt, chosen and rejected, got {type(row).__name__}")
        prompt = _pair_turns(row, "prompt", where(k))
        pair = []
        for key in ("chosen", "rejected"):
            resp = _pair_turns(row, key, where(k))
            ids, m = _conversation(prompt + resp, where(k), sum(x["role"] == "assistant" for x in resp))
            if not m.any():
                raise WorkError(f"{where(k)}: the {key} response renders to no token (expected a reply to train on)")
            pair.append((ids, m))
        if max(len(ids) for ids, _ in pair) > S["seq_len"]:
            note(notes, "long", where(k))
            continue
        seqs += pair
    return _segments(seqs)


def _text_of(v, where):
    if isinstance(v, str):
        return v
    raise WorkError(f"{where}: field {S['field']!r} is {type(v).__name__}, expected a string")


def _decode(piece, notes):
    """A text piece's bytes as str; invalid UTF-8 is counted (an error with --strict) and read as U+FFFD."""
    b, path, line = piece[0], piece[3], piece[4]
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        note(notes, "utf8", f"{path}:{line + b.count(NL, 0, e.start)}")
    text = b.decode("utf-8", errors="replace")
    n = text.count("\ufffd") - b.decode("utf-8", errors="ignore").count("\ufffd")
    notes["utf8"][0] += n - 1
    return text


def run(task):
    kind, ref, payload = task
    try:
        return _run(kind, ref, payload)
    except WorkError:
        raise
    except Exception as e:  # noqa: BLE001 — anything else still names where it happened
        where = f"{payload[0][3]}:{payload[0][4]}" if kind == "pieces" and payload else \
            f"{ref[0]}:{ref[1]}" if kind == "jsonl" else f"{ref[0]}: row {ref[1]}"
        raise WorkError(f"{where}: {type(e).__name__}: {e}") from None


def _run(kind, ref, payload):
    notes = {}
    if kind == "pieces":
        texts = [p[0] if S["tok"] is None else _decode(p, notes) for p in payload]
        return _docs(texts, [p[1] for p in payload], [p[2] for p in payload],
                     [f"{p[3]}:{p[4]}" for p in payload]) + (notes,)
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
            if S["chat"] or S["pairs"]:
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
        if not S["chat"] and not S["pairs"]:
            vals = [_text_of(v, where(i)) if v is not None else None for i, v in enumerate(vals)]
    if S["pairs"]:
        return _pairs(vals, where, notes) + (notes,)
    if S["chat"]:
        return _chat(vals, where) + (notes,)
    keep = []
    for i, v in enumerate(vals):  # an empty document gives nothing, not a lone EOS
        if v:
            keep.append(i)
        else:
            note(notes, "null" if v is None else "empty", where(i))
    texts = [vals[i] for i in keep]
    return _docs(texts, [True] * len(keep), [True] * len(keep), [where(i) for i in keep]) + (notes,)
