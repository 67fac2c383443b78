#!/usr/bin/env python3
"""test_tokenize_inputs.py — tools/tokenize on defective inputs and tokenizers: a chat template that
rewrites earlier turns, null and empty rows, invalid UTF-8, a JSON lone surrogate, a corrupt Arrow
file, a `datasets` folder missing a file, and a vocab whose ids have gaps. Each ends in correct output,
a counted warning (an error with --strict) or one line naming the file and line or row."""
import json
import os
import sys

from qt_test import Skip, run_tests
from test_tokenize import all_tokens, bpe_tokenizer, ids, need_tokenizers, read_shard, run_tool, shards

# Mistral v0.3's layout: the system prompt goes into the last user turn, so a prefix rendering of the
# conversation is no prefix of the whole one
MISTRAL = ("{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
           "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
           "{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}"
           "{{- bos_token }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
           "{%- if message == user_messages[-1] and system_message is defined %}"
           "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
           "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
           "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content']|trim + eos_token }}"
           "{%- endif %}{%- endfor %}")
# the last reply again, above the conversation: a prefix rendering is no prefix, and the last reply
# stands twice
TWICE = ("{% if not add_generation_prompt %}(last: {{ messages[-1]['content'] }})\n{% endif %}"
         "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant: {% endif %}")


def mistral_tokenizer(tmp, template):
    text = "".join(f"<s>[INST] Say ok {i}[/INST] ok</s>[INST] Answer ok or no.\n\nAgain: ok[/INST] no</s>"
                   for i in range(100))
    return bpe_tokenizer(os.path.join(tmp, "tok"), text, vocab=350, specials=("<s>", "</s>"),
                         config={"eos_token": "</s>", "bos_token": "<s>", "chat_template": template})


def test_chat_template_rewrites_turns(tmp):
    """The replies' words also stand in the user's turns and in the system prompt: the mask must lie
    on the assistant's turns (" ok</s>"), found whatever the template did to earlier turns."""
    tok, tj = mistral_tokenizer(tmp, MISTRAL)
    conv = [{"role": "system", "content": "Answer ok or no."}, {"role": "user", "content": "Say ok"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Again: ok"},
            {"role": "assistant", "content": " ok "}]
    src = os.path.join(tmp, "c.jsonl")
    open(src, "w").write(json.dumps({"messages": conv}) + "\n")
    out = os.path.join(tmp, "out")
    run_tool("--tokenizer", tj, "--chat", src, "--out", out, "--eval-frac", "0", "--quiet")
    got_t, got_m = all_tokens(out)
    pieces = [("<s>[INST] Say ok[/INST]", 0), (" ok</s>", 1), ("[INST] Answer ok or no.\n\nAgain: ok[/INST]", 0),
              (" ok</s>", 1)]
    text = "".join(p for p, _ in pieces)
    enc = tok.encode(text, add_special_tokens=False)
    spans, at = [], 0
    for p, trained in pieces:
        if trained:
            spans.append((at + 1, at + len(p)))  # the reply and its </s>; the space goes with "ok"'s token
        at += len(p)
    want_m = [int(any(a < e and b > s for s, e in spans)) for a, b in enc.offsets]
    assert got_t == enc.ids, f"tokens differ from the hand-rendered Mistral layout:\n{got_t}\n{enc.ids}"
    assert got_m == want_m, f"mask differs (not on the assistant's turns):\n{got_m}\n{want_m}"


def test_chat_template_copies_the_reply(tmp):
    """A template without generation markers that renders each reply twice: refused, naming why and
    the fix, never a mask on one copy picked by chance."""
    tok, tj = mistral_tokenizer(tmp, TWICE)
    src = os.path.join(tmp, "c.jsonl")
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "more"}, {"role": "assistant", "content": "no"}]
    open(src, "w").write(json.dumps({"messages": conv}) + "\n")
    r = run_tool("--tokenizer", tj, "--chat", src, "--out", os.path.join(tmp, "out"), ok=False)
    assert r.returncode != 0 and "c.jsonl:1: message 3:" in r.stderr and "2 times" in r.stderr \
        and "{% generation %}" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_chat_marker_characters_in_text(tmp):
    """A conversation that holds U+E000, the character that marks a reply in the probe rendering of a
    template that rewrites earlier turns: refused naming the character and the fix, not taken for a
    template that renders the reply twice."""
    tok, tj = mistral_tokenizer(tmp, MISTRAL)
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say \ue000 ok"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Again"},
            {"role": "assistant", "content": "no"}]
    src = os.path.join(tmp, "c.jsonl")
    open(src, "w").write(json.dumps({"messages": conv}) + "\n")
    r = run_tool("--tokenizer", tj, "--chat", src, "--out", os.path.join(tmp, "out"), ok=False)
    assert r.returncode != 0 and "c.jsonl:1: message 2:" in r.stderr and "U+E000" in r.stderr \
        and "{% generation %}" in r.stderr and "Traceback" not in r.stderr, r.stderr


def need_pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401
        return pa
    except ImportError:
        raise Skip("no pyarrow (pip install pyarrow)")


def datasets_folder(pa, d, tables, missing=()):
    """A folder as datasets' save_to_disk writes it: Arrow stream files listed in state.json (the ones
    named in `missing` listed, not written)."""
    os.makedirs(d, exist_ok=True)
    names = [f"data-{i:05d}-of-{len(tables):05d}.arrow" for i in range(len(tables))]
    for name, t in zip(names, tables):
        if name in missing:
            continue
        with pa.OSFile(os.path.join(d, name), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
            w.write_table(t)
    json.dump({"_data_files": [{"filename": n} for n in names], "_split": None}, open(os.path.join(d, "state.json"), "w"))
    return names


def test_null_and_empty_rows(tmp):
    """Null and empty texts in Parquet, a `datasets` folder and JSON lines: skipped, counted in the
    summary, a warning naming the first; --strict makes the first an error naming its row."""
    pa = need_pyarrow()
    import pyarrow.parquet as pq
    texts = ["first text", None, "", "second", None]
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), os.path.join(tmp, "a.parquet"))
    datasets_folder(pa, os.path.join(tmp, "ds"), [pa.table({"text": pa.array(texts[1:], pa.string())})])
    open(os.path.join(tmp, "c.jsonl"), "w").write('{"text": "x y"}\n{"text": ""}\n')
    for src, null, empty, first in (("a.parquet", 2, 1, "a.parquet: row 1"), ("ds", 2, 1, "data-00000-of-00001.arrow: row 0"),
                                    ("c.jsonl", 0, 1, "c.jsonl:2")):
        r = run_tool("--byte-level", os.path.join(tmp, src), "--out", os.path.join(tmp, "o-" + src), "--quiet")
        assert f"skipped {null} null + {empty} empty rows" in r.stdout, f"{src}: {r.stdout}"
        assert first in r.stderr and "warning" in r.stderr, f"{src}: {r.stderr}"
        r = run_tool("--byte-level", os.path.join(tmp, src), "--strict", "--out", os.path.join(tmp, "s-" + src), ok=False)
        err = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(err) == 1 and first in err[0] and "--strict" in err[0], f"{src}: {r.stderr}"
    toks, _ = all_tokens(os.path.join(tmp, "o-a.parquet"))
    assert bytes(toks) == b"first textsecond", "the non-empty rows must still be written"


def test_invalid_utf8_text(tmp):
    """A text file with invalid UTF-8: the bytes are counted and the first line named (never a silent
    U+FFFD); --strict makes it an error."""
    tok, tj = bpe_tokenizer(os.path.join(tmp, "tok"), "hello world\n" * 20, vocab=300)
    src = os.path.join(tmp, "in.txt")
    open(src, "wb").write(b"hello\nworld\nbad \xff\xfe bytes\n")
    r = run_tool("--tokenizer", tj, src, "--out", os.path.join(tmp, "a"), "--quiet")
    assert "2 invalid UTF-8" in r.stdout, r.stdout
    assert "in.txt:3" in r.stderr and "invalid UTF-8" in r.stderr, r.stderr
    r = run_tool("--tokenizer", tj, src, "--strict", "--out", os.path.join(tmp, "b"), ok=False)
    assert r.returncode != 0 and "in.txt:3: invalid UTF-8" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_read_errors_name_the_place(tmp):
    """A JSON lone surrogate (text and chat) and an Arrow file cut short: one line naming the file and
    line, no traceback."""
    tok, tj = mistral_tokenizer(tmp, MISTRAL)
    src = os.path.join(tmp, "s.jsonl")
    open(src, "w").write('{"text": "fine"}\n{"text": "also fine"}\n{"text": "bad \\ud800 here"}\n')
    r = run_tool("--tokenizer", tj, src, "--out", os.path.join(tmp, "a"), ok=False)
    assert r.returncode != 0 and "s.jsonl:3:" in r.stderr and "surrogate" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    chat = os.path.join(tmp, "c.jsonl")
    open(chat, "w").write('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\\udc00"}]}\n')
    r = run_tool("--tokenizer", tj, "--chat", chat, "--out", os.path.join(tmp, "b"), ok=False)
    assert r.returncode != 0 and "c.jsonl:1:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    pa = need_pyarrow()
    d = os.path.join(tmp, "ds")
    names = datasets_folder(pa, d, [pa.table({"text": [f"row {i} " * 50 for i in range(2000)]})])
    path = os.path.join(d, names[0])
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    r = run_tool("--byte-level", d, "--out", os.path.join(tmp, "c"), ok=False)
    assert r.returncode != 0 and f"{names[0]}: row " in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_datasets_folder_missing_file(tmp):
    pa = need_pyarrow()
    d = os.path.join(tmp, "ds")
    t = pa.table({"text": ["a", "b"]})
    names = datasets_folder(pa, d, [t, t], missing=("data-00001-of-00002.arrow",))
    r = run_tool("--byte-level", d, "--out", os.path.join(tmp, "out"), ok=False)
    err = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(err) == 1 and f"{d}: missing {names[1]}" in err[0], r.stderr


def test_vocab_with_gaps(tmp):
    """A word-level vocab whose ids leave gaps, one of them >= 65536: no id is cut to 16 bits, the
    header's vocab_size is the largest id + 1; a small gap still gives vocab_size max id + 1."""
    tk = need_tokenizers()
    for top, tb in ((70000, 4), (40, 2)):
        vocab = {"a": 0, "b": 1, "c": 5, "far": top, "<eos>": 7}
        tok = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="a"))
        tok.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
        d = os.path.join(tmp, f"tok{top}")
        os.makedirs(d)
        tok.save(os.path.join(d, "tokenizer.json"))
        json.dump({"eos_token": "<eos>"}, open(os.path.join(d, "tokenizer_config.json"), "w"))
        src = os.path.join(tmp, "in.txt")
        open(src, "w").write("a far b c far\n")
        out = os.path.join(tmp, f"out{top}")
        run_tool("--tokenizer", os.path.join(d, "tokenizer.json"), src, "--out", out, "--eval-frac", "0", "--quiet")
        h, toks, _ = read_shard(shards(out, "train_")[0])
        assert (h["vocab"], h["token_bytes"]) == (top + 1, tb), h
        assert toks == ids(tok, "a far b c far\n") + [7], toks


def main():
    try:
        import numpy  # noqa: F401 — tools/tokenize needs it
    except ImportError:
        print("SKIP test_tokenize_inputs: no numpy (pip install numpy)")
        return 0
    return run_tests(globals(), sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
