#!/usr/bin/env python3
"""lora_quality.py — LoRA r=16 against full fine-tuning on a chat instruction set, CPU engine, end to end.

  python3 bench/lora_quality.py [--dir DIR] [--pretrain-steps N] [--ft-steps N] [--lr-full X] [--lr-lora X]

Needs the built qtrain ($BUILD, default build), python3, numpy, tokenizers, jinja2 and matplotlib (the
plot). Every input is generated here from fixed seeds (the instruction set, the tokenizer, the corpus
beside tinyshakespeare), so a rerun on the same binary gives the same figures. Steps, files under
$OUT/lora_quality (else --dir):
1. corpus: ../shared/data/tinyshakespeare.txt (or --source) + an almanac of generated text that uses the
   instruction set's words (people, towns, trades; sums written out; number and word lists), ~30% of it.
2. tokenizer: a 1,024-token byte-level BPE with ChatML's <|im_start|>, <|im_end|> (the EOS) and a ChatML
   chat template, trained on the corpus and on a few rendered conversations.
3. pretrain: a small Qwen2-shaped model from scratch on the corpus (`tools/tokenize` shards), exported.
4. instructions: 4 task kinds, one conversation each row (user turn, assistant reply): look a person's
   town or trade up in a note given in the prompt, add two numbers, reverse a list of words, sort a list
   of numbers. `tools/tokenize --chat --seq-len` packs them; only assistant tokens carry loss; the eval
   split is the last windows (conversations never trained on).
5. fine-tune from the pretrained export, same steps, batches and schedule: full fine-tuning (every
   weight) and LoRA r=16, alpha 32 on q, k, v, o, gate, up, down (embeddings, norms frozen), each at its
   own learning rate (--lr-full, --lr-lora; LoRA's higher, as users set it).
6. report: the assistant-token eval loss of each run at every eval, the final ratio LoRA / full, a table
   (results.md) and both curves (curves.png, tools/plot).
--skip-pretrain reuses DIR/pretrain, --report-only redraws the report of the runs in DIR. Cost: the pretraining
took 10.8 CPU minutes (512k tokens, one thread), each fine-tune about 300k tokens plus 10 evaluations of 16k; on
this 2-core machine with other jobs holding its load at 6-9 the whole run took about 55 minutes of wall time."""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ONSETS = ["b", "br", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "th", "v", "z"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "io"]
CODAS = ["", "", "n", "r", "s", "l", "th", "x", "m"]
TRADES = ["baker", "smith", "tailor", "weaver", "miller", "potter", "mason", "fisher", "carter", "brewer",
          "cooper", "glover", "herald", "jester", "scribe", "tanner"]


def word(rng, syll):
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syll)).title()


class World:
    """The generated people (first and last name, town, trade) and towns, and the words lists draw from."""

    def __init__(self, rng, words, n_people=600, n_towns=60):
        self.towns = sorted({word(rng, 2) for _ in range(n_towns * 2)})[:n_towns]
        rng.shuffle(self.towns)
        names = set()
        while len(names) < n_people:
            names.add(f"{word(rng, rng.randint(1, 2))} {word(rng, 2)}")
        self.people = [(n, rng.choice(self.towns), rng.choice(TRADES)) for n in sorted(names)]
        rng.shuffle(self.people)
        self.words = words


def common_words(text, n=400):
    counts = {}
    for w in re.findall(r"[a-z]+", text.lower()):
        if 3 <= len(w) <= 8:
            counts[w] = counts.get(w, 0) + 1
    return sorted(sorted(counts), key=lambda w: -counts[w])[:n]


def almanac(rng, world, nbytes):
    """Plain text (no chat) with the tasks' vocabulary: facts about people, sums in words and symbols,
    lists of numbers and words. The base learns the tokens and some arithmetic; not the chat format."""
    out, size = [], 0
    while size < nbytes:
        kind = rng.randrange(4)
        if kind == 0:
            ps = rng.sample(world.people, rng.randint(3, 6))
            s = " ".join(f"{n} lives in {t} and works as a {j}." for n, t, j in ps)
        elif kind == 1:
            s = " ".join(f"{a} + {b} = {a + b}." for a, b in
                         ((rng.randint(0, 99), rng.randint(0, 99)) for _ in range(rng.randint(3, 8))))
        elif kind == 2:
            xs = [rng.randint(0, 99) for _ in range(rng.randint(4, 9))]
            s = "The numbers " + " ".join(map(str, xs)) + " and the words " + " ".join(
                rng.sample(world.words, rng.randint(3, 7))) + "."
        else:
            t = rng.choice(world.towns)
            ps = [p for p in world.people if p[1] == t][:4]
            s = f"In {t} there live " + ", ".join(f"{n} the {j}" for n, _, j in ps) + "." if ps else f"{t}."
        out.append(s + "\n")
        size += len(s) + 1
    return "".join(out)


def conversation(rng, world):
    """One instruction row: (task kind, user turn, assistant reply)."""
    kind = rng.choice(["lookup", "add", "reverse", "sort"])
    if kind == "lookup":
        ps = rng.sample(world.people, rng.randint(2, 4))
        note = " ".join(f"{n} lives in {t} and works as a {j}." for n, t, j in ps)
        n, t, j = rng.choice(ps)
        if rng.random() < 0.5:
            return kind, f"Note: {note}\nWhere does {n} live?", f"{n} lives in {t}."
        return kind, f"Note: {note}\nWhat is the trade of {n}?", f"{n} is a {j}."
    if kind == "add":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return kind, f"What is {a} plus {b}?", f"{a} + {b} = {a + b}."
    if kind == "reverse":
        ws = rng.sample(world.words, rng.randint(3, 6))
        return kind, "Reverse the order of these words: " + " ".join(ws), " ".join(reversed(ws))
    xs = [rng.randint(0, 99) for _ in range(rng.randint(3, 7))]
    return kind, "Sort these numbers from smallest to largest: " + " ".join(map(str, xs)), \
        " ".join(map(str, sorted(xs)))


def run(cmd, log=None, **kw):
    t = time.time()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)
    if log:
        open(log, "w").write(r.stdout + r.stderr)
    if r.returncode != 0:
        sys.exit(f"lora_quality: {' '.join(cmd[:3])} ... failed ({r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return r, time.time() - t


def tokenizer(folder, texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=1024, show_progress=False, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    json.dump({"eos_token": "<|im_end|>", "chat_template": CHATML},
              open(os.path.join(folder, "tokenizer_config.json"), "w"))
    return os.path.join(folder, "tokenizer.json")


def model_yaml(a):
    return (f"model: {{arch: qwen2, vocab_size: 1024, hidden_size: {a.hidden}, num_layers: {a.layers}, num_heads: "
            f"{a.heads}, num_kv_heads: {a.heads // 2}, intermediate_size: {a.hidden * 3}, rope_theta: 10000, "
            f"rms_norm_eps: 1e-6, tie_embeddings: true, qkv_bias: true, max_seq_len: {a.seq_len}}}\n")


def start(a, name, data, extra, steps, lr, micro_batch, every, eval_batches, threads):
    """Starts one qtrain run on the CPU engine with `threads` OpenMP threads; returns (folder, process)."""
    d = os.path.join(a.dir, name)
    subprocess.run(["rm", "-rf", d])
    os.makedirs(d)
    cfg = os.path.join(d, "run.yaml")
    open(cfg, "w").write(
        f"seed: 1234\ndevice: cpu\nrun: {{dir: '{d}'}}\n" + extra +
        f"data: {{train: '{data}/train_*.bin', eval: '{data}/eval_*.bin', seq_len: {a.seq_len}, "
        f"micro_batch: {micro_batch}, grad_accum: 1}}\n"
        f"optim: {{lr: {lr}, schedule: cosine, warmup: {steps // 20}, final_lr_frac: 0.1, steps: {steps}, "
        f"weight_decay: {0.1 if name == 'pretrain' else 0.0}, grad_clip: 1.0}}\n"
        f"eval: {{every: {every}, batches: {eval_batches}}}\ncheckpoint: {{every: 0, keep: 1}}\n"
        f"export: {{dtype: fp32}}\nlog: {{every: 10}}\n")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = open(os.path.join(d, "stdout.txt"), "w")
    return d, subprocess.Popen([os.path.join(a.build, "qtrain"), cfg], cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT)


def finish(runs):
    """Waits for the started runs; exits naming the first that failed. Returns their wall seconds."""
    t, secs = time.time(), []
    for d, p in runs:
        if p.wait() != 0:
            sys.exit(f"lora_quality: qtrain {d}/run.yaml failed ({p.returncode}):\n"
                     + open(os.path.join(d, "stdout.txt")).read()[-3000:])
        secs.append(time.time() - t)
        print(f"{os.path.basename(d)}: done in {secs[-1]:.0f} s", flush=True)
    return secs


def evals(run_dir):
    """[(step, eval loss)] of a run's log."""
    out = []
    for line in open(os.path.join(run_dir, "log.jsonl")):
        r = json.loads(line)
        if r.get("type") == "eval" and isinstance(r.get("loss"), (int, float)):
            out.append((r["step"], r["loss"]))
    return out


def report(a, pre, full, lora, base, tf, tl, total):
    """The eval losses of both runs, their ratio and the setting: printed, in results.md; both curves in curves.png."""
    ef, el, e0 = evals(full), evals(lora), evals(base)[-1][1]
    lines = [f"model: {a.layers} layers, hidden {a.hidden}, {a.heads}/{a.heads // 2} heads, ffn {a.hidden * 3}, vocab 1024 "
             f"(BPE), seq {a.seq_len}; pretrain {a.pretrain_steps} steps of {a.pretrain_micro_batch} sequences at lr "
             f"{a.pretrain_lr}; fine-tune {a.ft_steps} steps of {a.ft_micro_batch} sequences, cosine, warmup {a.ft_steps // 20}, no weight decay",
             "", "| step | full FT eval (lr %g) | LoRA r=%d alpha %g eval (lr %g) | LoRA / full |" %
             (a.lr_full, a.rank, a.alpha, a.lr_lora), "|---|---|---|---|"]
    for (s, f), (_, l) in zip(ef, el):
        lines.append(f"| {s} | {f:.4f} | {l:.4f} | {l / f:.3f} |")
    ratio = el[-1][1] / ef[-1][1]
    lines += ["", f"pretraining: final eval loss {evals(pre)[-1][1]:.4f} on the corpus' last 5%; the base's assistant-token "
              f"eval loss before fine-tuning: {e0:.4f}", f"final assistant-token eval loss: full {ef[-1][1]:.4f}, LoRA {el[-1][1]:.4f}, ratio {ratio:.3f} "
              f"({'within' if ratio <= 1.05 else 'NOT within'} 5%)" +
              (f"; full {tf:.0f} s, LoRA {tl:.0f} s, total {total:.0f} s" if total else "")]
    print("\n".join(lines))
    open(os.path.join(a.dir, "results.md"), "w").write("\n".join(lines) + "\n")
    run([sys.executable, os.path.join(ROOT, "tools", "plot"), os.path.join(full, "log.jsonl"),
         os.path.join(lora, "log.jsonl"), "-o", os.path.join(a.dir, "curves.png"), "--labels",
         f"full FT lr {a.lr_full:g},LoRA r={a.rank} lr {a.lr_lora:g}",
         "--title", "assistant-token loss: full fine-tuning vs LoRA (CPU fp32)"])


def prepare(a):
    """The corpus, the instruction set, the tokenizer and both sets of shards under a.dir; returns the shard folders."""
    rng = random.Random(1234)
    shakespeare = open(a.source, encoding="utf-8").read()
    world = World(rng, common_words(shakespeare))
    extra = almanac(rng, world, len(shakespeare) * 3 // 7)
    corpus = os.path.join(a.dir, "corpus.txt")
    open(corpus, "w").write(shakespeare + "\n" + extra)
    rows = [conversation(rng, world) for _ in range(a.conversations)]
    sft = os.path.join(a.dir, "sft.jsonl")
    with open(sft, "w") as f:
        for _, u, r in rows:
            f.write(json.dumps({"messages": [{"role": "user", "content": u},
                                             {"role": "assistant", "content": r}]}) + "\n")
    tj = tokenizer(os.path.join(a.dir, "tok"), [shakespeare, extra] + [
        f"<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n{r}<|im_end|>\n" for _, u, r in rows[:200]])
    tk = [sys.executable, os.path.join(ROOT, "tools", "tokenize"), "--tokenizer", tj, "--quiet"]
    pre_data, sft_data = os.path.join(a.dir, "pre_data"), os.path.join(a.dir, "sft_data")
    r, _ = run(tk + [corpus, "--out", pre_data, "--eval-frac", "0.05"])
    print(r.stdout.strip().splitlines()[-1])
    r, _ = run(tk + ["--chat", sft, "--seq-len", str(a.seq_len), "--out", sft_data, "--eval-frac", "0.05"])
    print(r.stdout.strip().splitlines()[-1], flush=True)
    return pre_data, sft_data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.environ.get("OUT", os.path.join(ROOT, "out")), "lora_quality"))
    ap.add_argument("--build", default=os.path.join(ROOT, os.environ.get("BUILD", "build")))
    ap.add_argument("--source", default=os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt"))
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--pretrain-micro-batch", type=int, default=4)
    ap.add_argument("--ft-micro-batch", type=int, default=4)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads of the pretraining run")
    ap.add_argument("--pretrain-steps", type=int, default=500)
    ap.add_argument("--pretrain-lr", type=float, default=3e-3)
    ap.add_argument("--conversations", type=int, default=12000)
    ap.add_argument("--ft-steps", type=int, default=300)
    ap.add_argument("--lr-full", type=float, default=1e-3)
    ap.add_argument("--lr-lora", type=float, default=5e-3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--skip-pretrain", action="store_true", help="reuse DIR/pretrain's export")
    ap.add_argument("--pretrain-only", action="store_true", help="stop after pretraining")
    ap.add_argument("--report-only", action="store_true", help="the report of the runs already in DIR")
    a = ap.parse_args()
    if a.report_only:
        report(a, *(os.path.join(a.dir, n) for n in ("pretrain", "full", "lora", "base")), None, None, None)
        return
    os.makedirs(a.dir, exist_ok=True)
    t0 = time.time()
    pre_data, sft_data = prepare(a)
    model = model_yaml(a)
    pre = os.path.join(a.dir, "pretrain")
    if not a.skip_pretrain:
        finish([start(a, "pretrain", pre_data, model + "init: {seed: 1234, std: 0.02}\n", a.pretrain_steps,
                      a.pretrain_lr, a.pretrain_micro_batch, a.pretrain_steps // 5, 4, a.threads)])
    if a.pretrain_only:
        return
    init = f"init: {{from: '{os.path.join(pre, 'ckpt', 'export')}'}}\n"
    every = max(1, a.ft_steps // 10)
    # the two fine-tunes side by side, one thread each: same work, no OpenMP barriers between cores
    full = start(a, "full", sft_data, init, a.ft_steps, a.lr_full, a.ft_micro_batch, every, a.eval_batches, 1)
    lora = start(a, "lora", sft_data, init + f"lora: {{rank: {a.rank}, alpha: {a.alpha}, dropout: 0.0}}\n",
                 a.ft_steps, a.lr_lora, a.ft_micro_batch, every, a.eval_batches, 1)
    # the base's own loss on the eval windows: one step at a learning rate that leaves the weights as they are
    base = start(a, "base", sft_data, init, 1, 1e-12, a.ft_micro_batch, 1, a.eval_batches, 1)
    tf, tl, _ = finish([full, lora, base])
    report(a, pre, full[0], lora[0], base[0], tf, tl, time.time() - t0)


if __name__ == "__main__":
    main()
