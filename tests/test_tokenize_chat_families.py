#!/usr/bin/env python3
"""test_tokenize_chat_families.py — tools/tokenize --chat with the official chat templates of Llama 3.1+,
Qwen3, Mistral v0.3 and Gemma 3, on a small BPE tokenizer per family that holds the family's special
tokens, and 24 random conversations each (system prompt or not, 1-4 turns, replies with surrounding
whitespace, Qwen3 replies with <think> blocks):
- the template with {% generation %} markers around each reply: tokens and mask equal transformers'
  apply_chat_template(..., return_assistant_tokens_mask=True);
- the official template (no markers): tokens equal transformers', and the mask equals the one transformers
  gives for the marked variant (which renders the same text), and, where rendering the conversation's
  prefixes gives prefixes of its rendering, the spans between those prefixes.

The templates in tests/chat_templates/ are the families' own, copied from public copies:
  llama3.jinja       meta-llama/Llama-3.3-70B-Instruct (as Llama-3.1-8B-Instruct's), from llama.cpp's
                     models/templates/meta-llama-Llama-3.3-70B-Instruct.jinja
  qwen3.jinja        Qwen/Qwen3-0.6B, from llama.cpp's models/templates/Qwen-Qwen3-0.6B.jinja
  mistral_v03.jinja  mistralai/Mistral-7B-Instruct-v0.3 tokenizer_config.json chat_template
  gemma3.jinja       google/gemma-3-4b-it tokenizer_config.json chat_template
The marked variants are made here by moving each reply (and its end-of-turn text) into a
{% generation %} block; MARKS checks that every edit applied."""
import json
import os
import random
import sys

from qt_test import ROOT, Skip, run_tests
from test_tokenize import all_tokens, need_tokenizers, run_tool

TEMPLATES = os.path.join(ROOT, "tests", "chat_templates")
N_CONVERSATIONS = 24

# family: template file, special tokens, BOS, EOS (as the family's tokenizer_config.json names them)
FAMILIES = {
    "llama3": ("llama3.jinja", ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"], "<|begin_of_text|>", "<|eot_id|>"),
    "qwen3": ("qwen3.jinja", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "mistral": ("mistral_v03.jinja", ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                                      "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
                "<s>", "</s>"),
    "gemma3": ("gemma3.jinja", ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
               "<bos>", "<eos>"),
}

# Mistral's and Gemma's tokenizers are SentencePiece BPEs: "▁" for a space, no pre-tokenizer
SENTENCEPIECE = ("mistral", "gemma3")

MARKS = {
    "llama3": [("{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
                "'<|eot_id|>' }}",
                "{%- if message['role'] == 'assistant' %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
                "{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{%- else %}"
                "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
                "'<|eot_id|>' }}{%- endif %}")],
    "qwen3": [("'<|im_start|>' + message.role + '\\n<think>\\n'", "'<think>\\n'"),
              ("'<|im_start|>' + message.role + '\\n' + content }}", "content }}"),
              ("{%- if loop.index0 > ns.last_query_index %}",
               "{{- '<|im_start|>' + message.role + '\\n' }}{% generation %}"
               "{%- if loop.index0 > ns.last_query_index %}"),
              ("{{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
               "{{- '<|im_end|>\\n' }}{% endgeneration %}\n    {%- elif message.role == \"tool\" %}")],
    "mistral": [("{{- \" \" + message[\"content\"]|trim + eos_token}}",
                 "{% generation %}{{- \" \" + message[\"content\"]|trim + eos_token}}{% endgeneration %}")],
    "gemma3": [("    {%- if message['content'] is string -%}",
                "{%- if role == 'model' -%}{% generation %}{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
                "{% endgeneration %}{%- else -%}\n    {%- if message['content'] is string -%}"),
               ("    {{ '<end_of_turn>\n' }}\n{%- endfor -%}",
                "    {{ '<end_of_turn>\n' }}\n{%- endif -%}\n{%- endfor -%}")],
}

WORDS = ("the cat sat on a mat and then we went home to see what is new today with you and me "
         "why how many apples are there in it yes no maybe sure thanks hello world code run fast").split()


def need_transformers():
    try:
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast
    except ImportError:
        raise Skip("no transformers (pip install transformers)")


def official(family):
    return open(os.path.join(TEMPLATES, FAMILIES[family][0]), encoding="utf-8").read()


def marked(family):
    """The official template with {% generation %} around each reply and its end-of-turn text."""
    t = official(family)
    for old, new in MARKS[family]:
        n = t.count(old)
        assert n >= 1, f"{family}: the generation-marker edit {old[:60]!r} does not apply to the template"
        t = t.replace(old, new)
    return t


def sentence(rng, lo=1, hi=9):
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    s = " ".join(words) + rng.choice([".", "?", "!", "", ",\nand more."])
    return s[0].upper() + s[1:]


def padded(rng, s):
    """Whitespace around a message now and then: Llama, Mistral and Gemma trim it, Qwen3 keeps it."""
    return rng.choice(["", "", " ", "\n"]) + s + rng.choice(["", "", " ", "\n", "  \n"])


def conversations(family, seed):
    rng = random.Random(seed)
    out = []
    for k in range(N_CONVERSATIONS):
        msgs = []
        if k % 3 != 1:
            msgs.append({"role": "system", "content": sentence(rng, 3, 8)})
        for t in range(rng.randint(1, 4)):
            user = padded(rng, sentence(rng))
            reply = sentence(rng) if rng.random() < 0.8 else user.strip()  # a reply may repeat the user's words
            if family == "qwen3":  # reasoning, an empty reasoning block, or none
                think = rng.choice([f"<think>\n{sentence(rng, 2, 6)}\n</think>\n\n", "<think>\n\n</think>\n\n", ""])
                reply = think + reply
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": padded(rng, reply)}]
        out.append(msgs)
    return out


def family_tokenizer(tmp, family, template):
    """A BPE (byte-level, or SentencePiece-like for SENTENCEPIECE) trained on the family's renderings of
    some conversations, with its special tokens; tokenizer_config.json names BOS, EOS and the chat
    template. Returns (tokenizers.Tokenizer, path)."""
    tk = need_tokenizers()
    _, specials, bos, eos = FAMILIES[family]
    from jinja2 import Environment
    env = Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(ValueError(m))
    corpus = [env.from_string(official(family)).render(messages=c, bos_token=bos or "", eos_token=eos)
              for c in conversations(family, 1000)]
    tok = tk.Tokenizer(tk.models.BPE())
    if family in SENTENCEPIECE:  # spaces as "▁" and no pre-tokenizer: merges run across words and newlines
        tok.normalizer = tk.normalizers.Replace(" ", "\u2581")
        tok.decoder = tk.decoders.Replace("\u2581", " ")
        alphabet = [chr(c) for c in range(33, 127)] + ["\u2581", "\n"]
    else:
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        alphabet = tk.pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(corpus * 4, tk.trainers.BpeTrainer(
        vocab_size=500, show_progress=False, special_tokens=specials, initial_alphabet=alphabet))
    if family == "qwen3":  # Qwen3 has <think> and </think> as added tokens that are not special
        tok.add_tokens(["<think>", "</think>"])
    folder = os.path.join(tmp, "tok-" + family)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    cfg = {"eos_token": eos, "chat_template": template}
    if bos:
        cfg["bos_token"] = bos
    json.dump(cfg, open(os.path.join(folder, "tokenizer_config.json"), "w"))
    return tok, path


def prefix_mask(hf, template, msgs, ids, offsets):
    """The assistant mask from spans between renderings of the conversation's prefixes: turn i is
    render(msgs[:i+1]) less render(msgs[:i], add_generation_prompt=True). None when a prefix's rendering
    is not a prefix of the conversation's (Mistral's system prompt moves, Qwen3 drops earlier reasoning)."""
    render = (lambda ms, gen: hf.apply_chat_template(ms, chat_template=template, tokenize=False,
                                                     add_generation_prompt=gen))
    text = render(msgs, False)
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        p, q = render(msgs[:i], True), render(msgs[:i + 1], False)
        if not (text.startswith(p) and text.startswith(q) and q.startswith(p)):
            return None
        for k, (a, b) in enumerate(offsets):
            if a < len(q) and b > len(p):
                mask[k] = 1
    return mask


def check_family(tmp, family):
    PreTrainedTokenizerFast = need_transformers()
    _, _, bos, eos = FAMILIES[family]
    convs = conversations(family, 7)
    src = os.path.join(tmp, f"{family}.jsonl")
    open(src, "w").write("".join(json.dumps({"messages": c}) + "\n" for c in convs))
    by_prefix = 0
    results = {}
    for variant, template in (("marked", marked(family)), ("official", official(family))):
        tok, tj = family_tokenizer(os.path.join(tmp, variant), family, template)
        hf = PreTrainedTokenizerFast(tokenizer_file=tj, eos_token=eos, **({"bos_token": bos} if bos else {}))
        out = os.path.join(tmp, f"out-{family}-{variant}")
        run_tool("--tokenizer", tj, "--chat", src, "--out", out, "--eval-frac", "0", "--quiet")
        got_t, got_m = all_tokens(out)
        want_t, want_m, eos_id = [], [], tok.token_to_id(eos)
        for c in convs:
            o = hf.apply_chat_template(c, chat_template=marked(family), tokenize=True, return_dict=True,
                                       return_assistant_tokens_mask=True)
            ids, m = list(o["input_ids"]), list(o["assistant_masks"])
            text = hf.apply_chat_template(c, chat_template=template, tokenize=False)
            assert text == hf.apply_chat_template(c, chat_template=marked(family), tokenize=False), \
                f"{family}: the marked template renders another text than the official one"
            assert sum(m) > 0, f"{family}: transformers marks no assistant token"
            if variant == "official":
                enc = tok.encode(text, add_special_tokens=False)
                pm = prefix_mask(hf, template, c, enc.ids, enc.offsets)
                if pm is not None:
                    assert pm == m, f"{family}: prefix spans {pm} differ from transformers' marked mask {m}"
                    by_prefix += 1
            sep = [] if ids[-1] == eos_id else [eos_id]  # the tool separates conversations by one EOS
            want_t += ids + sep
            want_m += m + [0] * len(sep)
        assert got_t == want_t, f"{family} {variant}: tokens differ from transformers' apply_chat_template"
        if got_m != want_m:
            bad = next(k for k, (a, b) in enumerate(zip(got_m, want_m)) if a != b)
            text = tok.decode(got_t[max(0, bad - 8):bad + 8], skip_special_tokens=False)
            raise AssertionError(f"{family} {variant}: mask differs from transformers' first at token {bad} "
                                 f"(ours {got_m[bad]}, theirs {want_m[bad]}) in {text!r}")
        if family == "qwen3":  # the last reply's reasoning stays in the text, as <think> tokens trained on
            think = tok.token_to_id("<think>")
            assert any(t == think and m for t, m in zip(got_t, got_m)), "qwen3: no <think> token trained on"
        results[variant] = got_m
    assert by_prefix > 0, f"{family}: no conversation checked against prefix renderings"
    print(f"  {family}: {len(convs)} conversations, {sum(results['official'])} assistant tokens, "
          f"{by_prefix} also checked by prefix renderings")


def test_llama3(tmp):
    check_family(tmp, "llama3")


def test_qwen3_think_tags_kept(tmp):
    check_family(tmp, "qwen3")


def test_mistral_v03(tmp):
    check_family(tmp, "mistral")


def test_gemma3(tmp):
    check_family(tmp, "gemma3")


def main():
    try:
        import numpy  # noqa: F401 — tools/tokenize needs it
        import jinja2  # noqa: F401 — --chat needs it
    except ImportError as e:
        print(f"SKIP test_tokenize_chat_families: {e}")
        return 0
    return run_tests(globals(), sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
