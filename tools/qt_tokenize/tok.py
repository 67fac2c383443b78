"""tok.py — what the tool needs from a Hugging Face tokenizer folder: vocab size, EOS/BOS ids and the
chat template (tokenizer_config.json, special_tokens_map.json, chat_template.jinja), and where a
document may be cut without changing any token (cut_rules).

Cutting a document in two changes no token only if the tokenizer never looks across the cut: added
tokens are matched on the raw text, then the normalizer, then the pre-tokenizer splits the text into
pieces, and the model (BPE, WordPiece, Unigram) works inside each piece. Our cut points are between
ASCII letters and one newline or space:

  NL: "x\\n|y"   (cut after a newline that has a letter on both sides)
  SP: "x| y"    (cut before a space that has a letter on both sides)

Every regex pre-tokenizer of the GPT-2 family (GPT-2, cl100k / Llama 3, Qwen2, o200k) and the whitespace
splitters put a piece boundary there whatever follows or precedes: a letter run cannot continue past
the newline or space, `\\s+(?!\\S)` / `\\s*[\\r\\n]+` take the lone "\\n" as one piece both at the end of
a text and before a letter, and the optional prefix `[^\\r\\n\\p{L}\\p{N}]?` of a letter run takes the
space (so SP cuts before it) but never the newline. A whitespace run such as "  \\n" or "\\r\\n" is never
cut (that was issue 29: "  \\n" at the end of a piece is one piece, "ĠĠĊ", but "ĠĠ","Ċ" before a letter).
cut_rules() accepts only normalizers and pre-tokenizers of these kinds, no added token that contains
the cut characters or strips whitespace, and then checks each rule on probe texts with the tokenizer
itself. Anything else is never cut inside a document (memory then grows with the longest document)."""
import json
import os
import re

NL_RULE = re.compile(rb"[A-Za-z]\n(?=[A-Za-z])")
SP_RULE = re.compile(rb"[A-Za-z](?= [A-Za-z])")
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>")
SAFE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"}
SPLITTERS = {"Split", "Whitespace", "WhitespaceSplit", "BertPreTokenizer"}
PASSIVE = {"Digits", "Punctuation"}
PROBES = [
    "Hello world\nfoo bar  \nbaz qux\r\nquux x\ny zz\n\nend a b",
    "It's a\nlong  line   with  runs\tof\n   space x\ny 's\nt don't\nstop",
    "abc def\nghi 12 jkl\n34 mno\n.pqr stu\nvwx\n\n\nyz Q\nR",
]


class TokError(Exception):
    pass


def _token_text(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def _read_json(path):
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise TokError(f"{path}: not valid JSON ({e})")


def load(path, config_path=None, template_path=None):
    """Reads the tokenizer folder of tokenizer.json `path`. Returns a plain dict (it crosses to the
    worker processes): path, vocab, eos/bos token strings, add_bos, chat_template, special (the
    special-token strings a chat template sees), cut (names of the usable cut rules)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokError("--tokenizer needs the `tokenizers` package (pip install tokenizers); "
                       "--byte-level needs nothing")
    if not os.path.isfile(path):
        raise TokError(f"{path}: no such tokenizer file")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 — the tokenizers error type is not public
        raise TokError(f"{path}: cannot load tokenizer ({e})")
    folder = os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    cfg = _read_json(config_path or os.path.join(folder, "tokenizer_config.json"))
    stm = _read_json(os.path.join(folder, "special_tokens_map.json"))
    special = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"):
        v = _token_text(cfg.get(key)) or _token_text(stm.get(key))
        if v is not None:
            special[key] = v
    eos = special.get("eos_token")
    if eos is None:  # no config: a special added token with a usual EOS name
        added = {t["content"] for t in tj.get("added_tokens", []) if t.get("special")}
        eos = next((n for n in EOS_NAMES if n in added), None)
    template = None
    tp = template_path or os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(tp):
        template = open(tp, encoding="utf-8").read()
    elif template_path is None:
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{name, template}, ...]: the "default" one
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
    elif template_path:
        raise TokError(f"{template_path}: no such chat template file")
    # the largest id + 1, not the token count: a vocab with gaps (ids left out, added tokens placed
    # high) still has every id < vocab_size, and token_bytes is chosen from it
    vocab = max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    spec = {"path": path, "vocab": vocab, "eos": eos,
            "bos": special.get("bos_token"), "add_bos": bool(cfg.get("add_bos_token", False)),
            "chat_template": template, "special": special, "cut": cut_rules(tok, tj)}
    if "add_bos_token" not in cfg:  # no word from the config: what encode(add_special_tokens=True) adds
        lead = _template_bos(tj.get("post_processor"))
        if lead is not None:
            spec["bos"], spec["add_bos"] = lead, True
    for key in ("eos", "bos"):
        if spec[key] is not None and tok.token_to_id(spec[key]) is None:
            raise TokError(f"{path}: {key} token {spec[key]!r} (from the tokenizer config) is not in the vocab")
    spec["eos_id"] = tok.token_to_id(eos) if eos is not None else None
    spec["bos_id"] = tok.token_to_id(spec["bos"]) if spec["bos"] is not None else None
    if spec["add_bos"] and spec["bos_id"] is None:
        raise TokError(f"{path}: tokenizer_config.json asks for add_bos_token but names no bos_token")
    return spec


def _template_bos(node):
    """The special token a TemplateProcessing post-processor puts before a single text (Llama 3's
    <|begin_of_text|>), or None."""
    for p in ([node] if node and node.get("type") != "Sequence" else (node or {}).get("processors", [])):
        single = p.get("single") if p.get("type") == "TemplateProcessing" else None
        if single and "SpecialToken" in single[0]:
            return single[0]["SpecialToken"]["id"]
    return None


def _types(node):
    """The component types of a normalizer / pre-tokenizer node, Sequences flattened."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        out = []
        for child in node.get("normalizers") or node.get("pretokenizers") or []:
            out += _types(child)
        return out
    return [node]


def _structure_ok(tj):
    for n in _types(tj.get("normalizer")):
        if n["type"] not in SAFE_NORMALIZERS:
            return False
    pres = _types(tj.get("pre_tokenizer"))
    splits = 0
    for p in pres:
        t = p["type"]
        if t == "ByteLevel":
            if p.get("add_prefix_space"):
                return False
            splits += bool(p.get("use_regex", True))
        elif t in SPLITTERS:
            splits += 1
        elif t not in PASSIVE:
            return False
    return splits > 0


def cut_rules(tok, tj):
    """Names of the cut rules ("nl", "sp") that provably change no token for the tokenizer `tok`, whose
    tokenizer.json is the dict tj."""
    if not _structure_ok(tj):
        return []
    added = tj.get("added_tokens", [])
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        return []
    rules = []
    for name, rx, ch in (("nl", NL_RULE, "\n"), ("sp", SP_RULE, " ")):
        if any(ch in t["content"] for t in added):
            continue
        ok = True
        for probe in PROBES:
            b = probe.encode()
            whole = tok.encode(probe, add_special_tokens=False).ids
            for m in rx.finditer(b):
                a, c = b[:m.end()].decode(), b[m.end():].decode()
                if (tok.encode(a, add_special_tokens=False).ids
                        + tok.encode(c, add_special_tokens=False).ids) != whole:
                    ok = False
        if ok:
            rules.append(name)
    return rules


def find_cut(buf, rules, limit, window=1 << 16):
    """The last position p <= limit in buf where a rule allows a cut (buf[:p] and buf[p:] tokenize to
    the tokens of buf), preferring a newline; 0 when there is none."""
    for name in rules:
        rx = NL_RULE if name == "nl" else SP_RULE
        lo = max(0, limit - window)
        while True:
            last = None
            for m in rx.finditer(buf, lo, limit):
                last = m
            if last is not None:
                return last.end()
            if lo == 0:
                break
            lo = 0
    return 0
