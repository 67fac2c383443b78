"""chat.py — conversations to text with the tokenizer's chat template, and the character spans of the
assistant's turns (the loss mask keeps only the tokens inside them).

Rendering follows transformers' apply_chat_template: a sandboxed Jinja environment with trim_blocks and
lstrip_blocks, loopcontrols, a `tojson` filter, `raise_exception` and `strftime_now`, the special-token
strings as variables, and the `{% generation %}` tag. Spans:
- the template marks them with {% generation %}...{% endgeneration %}: exactly those (transformers'
  return_assistant_tokens_mask);
- else, for each assistant turn i, render(messages[:i], add_generation_prompt=True) must be a prefix of
  render(messages[:i+1]); the difference (the reply and the template's end-of-turn text, e.g.
  "reply<|im_end|>\\n") is the span. A template that rewrites earlier turns breaks this; the turn is
  then found by a rendering with its reply replaced by marker characters (Renderer._located), never by
  searching for the reply's words, which the user's turns may repeat."""
import json
from contextlib import contextmanager
from datetime import datetime


MARK_A, MARK_B = "\ue000", "\ue001"  # private-use characters that delimit a reply in a probe rendering


class ChatError(Exception):
    pass


def messages_of(row, messages_field="messages"):
    """A row (dict) in any supported layout -> [{role, content}, ...]."""
    if not isinstance(row, dict):
        raise ChatError(f"expected an object with a conversation, got {type(row).__name__}")
    msgs = row.get(messages_field)
    if msgs is None and isinstance(row.get("conversations"), list):  # ShareGPT: from/value
        roles = {"human": "user", "gpt": "assistant", "system": "system", "user": "user",
                 "assistant": "assistant"}
        msgs = [{"role": roles.get(m.get("from"), m.get("from")), "content": m.get("value")}
                for m in row["conversations"]]
    if msgs is None and "completion" in row:
        p, c = row.get("prompt"), row["completion"]
        msgs = (p if isinstance(p, list) else [{"role": "user", "content": p}]) + \
               (c if isinstance(c, list) else [{"role": "assistant", "content": c}])
    if msgs is None and "output" in row and "instruction" in row:
        user = row["instruction"] + (("\n\n" + row["input"]) if row.get("input") else "")
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]
        if row.get("system"):
            msgs.insert(0, {"role": "system", "content": row["system"]})
    if not isinstance(msgs, list) or not msgs:
        raise ChatError(f"no conversation: expected `{messages_field}` [{{role, content}}...], prompt/"
                        f"completion or instruction/input/output; has {', '.join(sorted(row))}")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise ChatError(f"message {i}: expected {{role, content: string}}, got {json.dumps(m)[:80]}")
    return msgs


class Renderer:
    def __init__(self, template, special):
        try:
            import jinja2
            from jinja2 import nodes
            from jinja2.ext import Extension
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise ChatError("--chat needs the `jinja2` package (pip install jinja2)")
        if not template:
            raise ChatError("the tokenizer has no chat_template (tokenizer_config.json or chat_template.jinja); "
                            "give one with --chat-template FILE")
        spans = self.spans = []
        rendered = self.rendered = []

        class Generation(Extension):  # {% generation %} ... {% endgeneration %}, as in transformers
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
                return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

            def _mark(self, caller):
                rv = caller()
                start = sum(len(b) for b in rendered)
                spans.append((start, start + len(rv)))
                return rv

        def raise_exception(msg):
            raise ChatError(f"chat template: {msg}")

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.tpl = env.from_string(template)
        except jinja2.TemplateError as e:
            raise ChatError(f"chat template: {e}")
        self.tagged = "generation" in template and "endgeneration" in template
        self.special = special
        self.head = None  # _turn_head(), computed once

    def render(self, msgs, gen_prompt=False):
        self.spans.clear()
        self.rendered.clear()
        try:
            for block in self.tpl.generate(messages=msgs, add_generation_prompt=gen_prompt, tools=None,
                                           documents=None, **self.special):
                self.rendered.append(block)
        except ChatError:
            raise
        except Exception as e:  # noqa: BLE001 — any template error
            raise ChatError(f"chat template: {type(e).__name__}: {e}")
        return "".join(self.rendered)

    def __call__(self, msgs):
        """Returns (text, [(start, end) character spans of the assistant's turns])."""
        text = self.render(msgs)
        if self.tagged:
            return text, list(self.spans)
        spans, cursor = [], 0
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            p = self.render(msgs[:i], gen_prompt=True)
            q = self.render(msgs[:i + 1])
            if q.startswith(p) and text.startswith(q) and len(p) >= cursor:
                spans.append((len(p), len(q)))
            else:
                spans.append(self._located(msgs, i, text, cursor))
            cursor = spans[-1][1]
        return text, spans

    def _located(self, msgs, i, text, cursor):
        """The span of assistant turn i in `text` when the template rewrites earlier turns (Mistral's puts
        the system prompt into the last user turn, so a prefix render is no prefix; Qwen3's drops the
        <think> reasoning of replies before the last user turn): the conversation is rendered once more
        with reply i replaced by two marker characters. The text before the first marker and after the
        second must be the conversation's own; what the conversation has between them is the reply as
        the template renders it (trimmed, its reasoning dropped), found whatever copies of its words the
        rest of the conversation holds. The span runs on over the template's end-of-turn text (what
        follows the reply when the turn ends the conversation, if it renders the reply once) and starts
        at the template's text before a reply (_turn_head) where the conversation has it there, as a
        prefix rendering's span does."""
        def probe(upto):
            ms = [dict(x) for x in msgs[:upto]]
            ms[i]["content"] = MARK_A + MARK_B
            return self.render(ms)
        if MARK_A in text or MARK_B in text:
            raise ChatError(f"message {i}: the conversation holds U+E000 or U+E001, the private-use characters "
                            "that mark the reply in a probe rendering; add {% generation %}...{% endgeneration %} "
                            "around the reply in the template (--chat-template FILE)")
        whole, last = probe(len(msgs)), probe(i + 1)
        if whole.count(MARK_A) != 1 or whole.count(MARK_B) != 1:
            raise ChatError(f"message {i}: the template renders the assistant's reply {whole.count(MARK_A)} times "
                            "and has no {% generation %} markers, so the trained tokens cannot be told apart; "
                            "add {% generation %}...{% endgeneration %} around the reply (--chat-template FILE)")
        a, b = whole.index(MARK_A), whole.index(MARK_B)
        tail = whole[b + 1:]
        eot = last[last.index(MARK_B) + 1:] if last.count(MARK_B) == 1 else ""
        end = len(text) - len(tail)
        if b < a or text[:a] != whole[:a] or not text.endswith(tail) or end < a or a < cursor:
            raise ChatError(f"message {i}: the template's rendering of the assistant's reply depends on its text "
                            "and the template has no {% generation %} markers; add {% generation %}..."
                            "{% endgeneration %} around the reply (--chat-template FILE)")
        head = self._turn_head()
        if head and a - len(head) >= cursor and text[a - len(head):a] == head:
            a -= len(head)
        return a, end + len(eot) if text.startswith(eot, end) else end

    def _turn_head(self):
        """The text the template puts between the generation prompt and a reply (Mistral's " ", which
        the model generates as part of its first token), from a one-turn probe: render([user, reply])
        less render([user], add_generation_prompt=True), up to the reply; "" where that is no prefix."""
        if self.head is None:
            self.head = ""
            user = [{"role": "user", "content": "x"}]
            try:
                p = self.render(user, gen_prompt=True)
                q = self.render(user + [{"role": "assistant", "content": MARK_A + MARK_B}])
            except ChatError:
                return self.head
            if q.startswith(p) and q.count(MARK_A) == 1:
                self.head = q[len(p):q.index(MARK_A)]
        return self.head
