#!/usr/bin/env python3
"""lora_quality.py — LoRA against full fine-tuning on a chat instruction set, CPU engine, end to end.

  python3 bench/lora_quality.py [--setup known|skills] [--dir DIR] [--lrs-full X,Y] [--lrs-lora X,Y] [--ranks 16,64]

Needs the built qtrain ($BUILD, default build), python3, numpy, tokenizers, jinja2 and matplotlib (the
plot). Every input is generated here from fixed seeds (the instruction set, the tokenizer, the corpus
beside tinyshakespeare), so a rerun on the same binary gives the same figures. Steps, files under
$OUT/lora_quality (else --dir):
1. corpus: ../shared/data/tinyshakespeare.txt (or --source) + ~30% generated text. known (the default): the
   towns and trades of 200 generated people, each stated many times. skills: an almanac that uses the
   instruction set's words (people, towns, trades; sums written out; number and word lists). Documents split at
   blank lines, each ended by the EOS.
2. tokenizer: a 1,024-token byte-level BPE with ChatML's <|im_start|>, <|im_end|> (the EOS) and a ChatML
   chat template, trained on the corpus and on a few rendered conversations.
3. pretrain: a small Qwen2-shaped model from scratch on the corpus (`tools/tokenize` shards), exported.
4. instructions, one conversation each row (user turn, assistant reply): train, val (5%) and eval (5%) rows,
   each split tokenized on its own (`tools/tokenize --chat --seq-len`: only assistant tokens carry loss).
   known: questions whose answers the base pretrained on: a person's town, a person's trade, the next line of a
   speech of the play, the next speaker; val and eval rows each ask about people (10% each) and speeches (5% of
   the play each, its end) that no other split asks about, so they score the use of pretrained knowledge
   through the chat format, not answers memorised in fine-tuning. skills: new skills: look a person's town or
   trade up in a note given in the prompt, add two numbers, reverse a list of words, sort a list of numbers.
5. fine-tune from the pretrained export, same steps, batches, data order and schedule: full fine-tuning (every
   weight) at each of --lrs-full and LoRA (alpha = 2 x rank, on q, k, v, o, gate, up, down; embeddings and
   norms frozen) at each rank of --ranks and each of --lrs-lora, scored on the val rows. Each arm's learning
   rate is the one of the lowest final val loss; the chosen runs' final weights (LoRA: merged) are then scored
   on the eval rows, which play no part in the choice.
6. report: the sweep (final val loss of every run), the chosen runs' val loss at every eval, their final
   assistant-token eval loss and the ratio LoRA / full, a table (results.md) and the chosen runs' curves
   (curves.png, tools/plot).
--skip-pretrain reuses DIR/pretrain; a run whose folder holds a finished run of the same run.yaml is reused,
so a rerun with more ranks or rates runs only the new ones. Cost on this 2-core machine shared with other jobs
(load 4-7): pretraining (800 x 4 x 256 tokens, 2 threads) 26 minutes; the 6-run sweep (300 x 4 x 256 tokens
each plus 10 evaluations of 16 x 4 x 256, one thread each, 3 side by side) about 35 minutes; one pair of runs
side by side on an idle machine about 5 minutes."""
import argparse
import hashlib
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
        out.append(s + "\n\n")
        size += len(s) + 2
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


def speeches(text):
    """The play's speeches in order: [(speaker, [lines])], each a block 'NAME:\\nline...' between blank lines."""
    out = []
    for block in text.split("\n\n"):
        lines = [l for l in block.strip("\n").split("\n") if l.strip()]
        if len(lines) >= 2 and lines[0].endswith(":"):
            out.append((lines[0][:-1], lines[1:]))
    return out


def facts(rng, world, nbytes):
    """Plain text stating every person's town and trade many times over, in two phrasings: the knowledge
    the 'known' setup's chat questions ask for."""
    out, size = [], 0
    while size < nbytes:
        if rng.random() < 0.6:
            ps = rng.sample(world.people, rng.randint(3, 6))
            s = " ".join(f"{n} lives in {t} and works as a {j}." for n, t, j in ps)
        else:
            t = rng.choice(world.towns)
            ps = [p for p in world.people if p[1] == t]
            ps = rng.sample(ps, min(len(ps), 4))
            s = f"In {t} there live " + ", ".join(f"{n} the {j}" for n, _, j in ps) + "." if ps else f"{t}."
        out.append(s + "\n\n")
        size += len(s) + 2
    return "".join(out)


def known_conversation(rng, people, play):
    """One 'known' instruction row over knowledge the base pretrained on: (kind, user turn, assistant reply).
    people and play are the split's own persons and speeches, so train and eval rows never share an answer."""
    kind = rng.choice(["town", "trade", "line", "speaker"])
    if kind == "town":
        n, t, _ = rng.choice(people)
        return kind, f"Where does {n} live?", f"{n} lives in {t}."
    if kind == "trade":
        n, _, j = rng.choice(people)
        return kind, f"What is the trade of {n}?", f"{n} works as a {j}."
    if kind == "line":
        while True:
            who, lines = rng.choice(play)
            if len(lines) >= 2:
                break
        k = rng.randint(1, min(3, len(lines) - 1))
        return kind, "Continue this speech from the play:\n" + "\n".join(lines[:k]), lines[k]
    i = rng.randrange(len(play) - 1)
    who, lines = play[i]
    return kind, f"{who}:\n" + "\n".join(lines) + "\n\nWho speaks next in the play?", play[i + 1][0]


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
    """Starts one qtrain run on the CPU engine with `threads` OpenMP threads; returns (folder, process), the
    process None when the folder already holds a finished run of the same run.yaml (a rerun adds runs)."""
    d = os.path.join(a.dir, name)
    cfg = os.path.join(d, "run.yaml")
    text = (f"# inputs {a.inputs}\nseed: 1234\ndevice: cpu\nrun: {{dir: '{d}'}}\n" + extra +
            f"data: {{train: '{data[0]}', eval: '{data[1]}', seq_len: {a.seq_len}, "
            f"micro_batch: {micro_batch}, grad_accum: 1}}\n"
            f"optim: {{lr: {lr}, schedule: cosine, warmup: {steps // 20}, final_lr_frac: 0.1, steps: {steps}, "
            f"weight_decay: {0.1 if name == 'pretrain' else 0.0}, grad_clip: 1.0}}\n"
            f"eval: {{every: {every}, batches: {eval_batches}}}\ncheckpoint: {{every: 0, keep: 1}}\n"
            f"export: {{dtype: fp32}}\nlog: {{every: {10 if name == 'pretrain' else 1}}}\n")
    if os.path.exists(os.path.join(d, "done")) and open(cfg).read() == text:
        return d, None
    subprocess.run(["rm", "-rf", d])
    os.makedirs(d)
    open(cfg, "w").write(text)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = open(os.path.join(d, "stdout.txt"), "w")
    return d, subprocess.Popen([os.path.join(a.build, "qtrain"), cfg], cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT)


def finish(d, p):
    """Waits for a started run; exits naming it if it failed, else marks its folder done."""
    if p and p.wait() != 0:
        sys.exit(f"lora_quality: qtrain {d}/run.yaml failed ({p.returncode}):\n"
                 + open(os.path.join(d, "stdout.txt")).read()[-3000:])
    open(os.path.join(d, "done"), "w").close()
    print(f"{os.path.basename(d)}: done", flush=True)


def run_all(a, jobs):
    """Runs the (name, data, extra, steps, lr) jobs, a.jobs at a time, one thread each."""
    live = []
    for j in jobs:
        if len(live) == a.jobs:
            finish(*live.pop(0))
        d, p = start(a, j[0], j[1], j[2], j[3], j[4], a.ft_micro_batch, max(1, j[3] // 10), a.eval_batches, 1)
        if p:
            live.append((d, p))
        else:
            finish(d, p)
    for r in live:
        finish(*r)


def records(run_dir, kind):
    """[(step, loss)] of a run's log records of this type ('train' or 'eval')."""
    out = []
    for line in open(os.path.join(run_dir, "log.jsonl")):
        r = json.loads(line)
        if r.get("type") == kind and isinstance(r.get("loss"), (int, float)):
            out.append((r["step"], r["loss"]))
    return out


def report(a, pre, base, sweep, best, chosen, held):
    """The sweep, the chosen runs' val curves, their eval losses and the ratios: printed, in results.md; the chosen
    runs' curves in curves.png. sweep: {arm: [(lr, folder)]}; best: {arm: lr}; chosen: {arm: folder of its
    run}; held: {arm: folder of the eval rows' run from its weights}."""
    rows = []
    for arm, runs in sweep.items():
        for lr, d in runs:
            mark = "**" if lr == best[arm] else ""
            rows.append(f"| {arm} | {mark}{lr:g}{mark} | {records(d, 'eval')[-1][1]:.4f} |")
    arms = list(sweep)
    ev = {arm: records(chosen[arm], "eval") for arm in arms}
    lines = [f"setup {a.setup}; model: {a.layers} layers, hidden {a.hidden}, {a.heads}/{a.heads // 2} heads, ffn {a.hidden * 3}, "
             f"vocab 1024 (BPE), seq {a.seq_len}; pretrain {a.pretrain_steps} steps of {a.pretrain_micro_batch} sequences at "
             f"lr {a.pretrain_lr}; fine-tune {a.ft_steps} steps of {a.ft_micro_batch} sequences, cosine, warmup "
             f"{a.ft_steps // 20}, no weight decay; LoRA alpha = 2 x rank, q k v o gate up down", "",
             "| arm | lr (chosen in bold) | final val loss |", "|---|---|---|", *rows, "",
             "| step | " + " | ".join(f"{arm} val (lr {best[arm]:g})" for arm in arms) + " | " +
             " | ".join(f"{arm} / full" for arm in arms[1:]) + " |", "|" + "---|" * (2 * len(arms))]
    for i, (s, f) in enumerate(ev["full"]):
        ls = [ev[arm][i][1] for arm in arms[1:]]
        lines.append(f"| {s} | {f:.4f} | " + " | ".join(f"{l:.4f}" for l in ls) + " | " +
                     " | ".join(f"{l / f:.3f}" for l in ls) + " |")
    lines += ["", f"pretraining: final eval loss {records(pre, 'eval')[-1][1]:.4f} on the corpus' last 5%; the base's "
              f"assistant-token eval loss before fine-tuning: {records(base, 'eval')[-1][1]:.4f}"]
    full = records(held["full"], "eval")[-1][1]
    for arm in arms[1:]:
        lo = records(held[arm], "eval")[-1][1]
        lines.append(f"final assistant-token eval loss: full {full:.4f}, {arm} {lo:.4f}, ratio {lo / full:.3f} "
                     f"({'within' if lo / full <= 1.05 else 'NOT within'} 5%)")
    print("\n".join(lines))
    open(os.path.join(a.dir, "results.md"), "w").write("\n".join(lines) + "\n")
    run([sys.executable, os.path.join(ROOT, "tools", "plot"), *(os.path.join(chosen[arm], "log.jsonl") for arm in arms),
         "-o", os.path.join(a.dir, "curves.png"), "--labels", ",".join(f"{arm} lr {best[arm]:g}" for arm in arms),
         "--title", f"assistant-token loss ({a.setup} setup, eval points: val rows): full fine-tuning vs LoRA (CPU fp32)"])


def chat_rows(path, rows):
    with open(path, "w") as f:
        for _, u, r in rows:
            f.write(json.dumps({"messages": [{"role": "user", "content": u},
                                             {"role": "assistant", "content": r}]}) + "\n")


def prepare(a):
    """The corpus, the instruction sets (train, val, eval), the tokenizer and the shards under a.dir; returns the
    pretraining (train, eval) shard globs and the fine-tuning ones by split. skills: new skills over a note in
    the prompt, every split drawn alike; known: questions whose answers the base pretrained on (towns and trades
    of a world's people, the play's next line or speaker); val and eval rows each ask about 10% of the people
    and 5% of the speeches (the play's end) that no other split asks about."""
    rng = random.Random(1234)
    shakespeare = open(a.source, encoding="utf-8").read()
    n_eval = a.conversations // 20
    if a.setup == "skills":
        world = World(rng, common_words(shakespeare))
        extra = almanac(rng, world, len(shakespeare) * 3 // 7)
    else:
        world, play = World(rng, [], n_people=200, n_towns=24), speeches(shakespeare)
        extra = facts(rng, world, len(shakespeare) * 3 // 7)
        cp, cs = len(world.people) * 4 // 5, len(play) * 9 // 10
        hp, hs = (len(world.people) - cp) // 2, (len(play) - cs) // 2
        pick = {"train": (world.people[:cp], play[:cs]), "val": (world.people[cp:cp + hp], play[cs:cs + hs]),
                "eval": (world.people[cp + hp:], play[cs + hs:])}
    rows = {}
    for split, n in (("train", a.conversations - n_eval), ("val", n_eval), ("eval", n_eval)):
        rows[split] = [conversation(rng, world) if a.setup == "skills" else known_conversation(rng, *pick[split])
                       for _ in range(n)]
        chat_rows(os.path.join(a.dir, f"sft_{split}.jsonl"), rows[split])
    corpus = os.path.join(a.dir, "corpus.txt")
    open(corpus, "w").write(shakespeare + "\n" + extra)
    tj = tokenizer(os.path.join(a.dir, "tok"), [shakespeare, extra] + [
        f"<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n{r}<|im_end|>\n" for _, u, r in rows["train"][:200]])
    tk = [sys.executable, os.path.join(ROOT, "tools", "tokenize"), "--tokenizer", tj, "--quiet"]
    pre_data = os.path.join(a.dir, "pre_data")
    # documents split at blank lines (the play's speeches, the generated paragraphs), each ended by the EOS
    # <|im_end|> as pretraining data are: the base knows the token that ends each reply
    r, _ = run(tk + [corpus, "--doc-sep", "\n\n", "--out", pre_data, "--eval-frac", "0.05"])
    print(r.stdout.strip().splitlines()[-1])
    sft = {}
    for split in rows:
        sft[split] = os.path.join(a.dir, f"sft_{split}")
        r, _ = run(tk + ["--chat", sft[split] + ".jsonl", "--seq-len", str(a.seq_len), "--out", sft[split],
                         "--eval-frac", "0"])
        print(f"{split}: " + r.stdout.strip().splitlines()[-1], flush=True)
        sft[split] += "/train_*.bin"
    digest = hashlib.sha256()
    for f in [tj, corpus] + [os.path.join(a.dir, f"sft_{split}.jsonl") for split in rows]:
        digest.update(open(f, "rb").read())
    a.inputs = digest.hexdigest()[:16]  # in each run.yaml: a finished run is reused only over the same inputs
    return (pre_data + "/train_*.bin", pre_data + "/eval_*.bin"), sft


def floats(s):
    return [float(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.environ.get("OUT", os.path.join(ROOT, "out")), "lora_quality"))
    ap.add_argument("--build", default=os.path.join(ROOT, os.environ.get("BUILD", "build")))
    ap.add_argument("--source", default=os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt"))
    ap.add_argument("--setup", choices=["known", "skills"], default="known")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--pretrain-micro-batch", type=int, default=4)
    ap.add_argument("--ft-micro-batch", type=int, default=4)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="OpenMP threads of the pretraining run")
    ap.add_argument("--jobs", type=int, default=2, help="fine-tunes side by side, one thread each")
    ap.add_argument("--pretrain-steps", type=int, default=800)
    ap.add_argument("--pretrain-lr", type=float, default=3e-3)
    ap.add_argument("--conversations", type=int, default=12000)
    ap.add_argument("--ft-steps", type=int, default=300)
    ap.add_argument("--lrs-full", type=floats, default="3e-4,1e-3,3e-3", help="full fine-tuning's learning rates")
    ap.add_argument("--lrs-lora", type=floats, default="1e-3,3e-3,1e-2", help="LoRA's learning rates")
    ap.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default="16", help="LoRA ranks (alpha 2 x rank)")
    ap.add_argument("--skip-pretrain", action="store_true", help="reuse DIR/pretrain's export")
    ap.add_argument("--pretrain-only", action="store_true", help="stop after pretraining")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    t0 = time.time()
    pre_data, sft = prepare(a)
    model = model_yaml(a)
    pre = os.path.join(a.dir, "pretrain")
    if not a.skip_pretrain:
        d, p = start(a, "pretrain", pre_data, model + "init: {seed: 1234, std: 0.02}\n", a.pretrain_steps,
                     a.pretrain_lr, a.pretrain_micro_batch, a.pretrain_steps // 5, 4, a.threads)
        finish(d, p)
        print(f"pretraining: {time.time() - t0:.0f} s", flush=True)
    if a.pretrain_only:
        return
    init = f"init: {{from: '{os.path.join(pre, 'ckpt', 'export')}'}}\n"
    arms = {"full": ("full", init)}
    for r in a.ranks:  # the merged export: a model the eval run below starts from
        arms[f"LoRA r={r}"] = (f"lora_r{r}", init + f"lora: {{rank: {r}, alpha: {2 * r}, dropout: 0.0, export: merged}}\n")
    val, held = (sft["train"], sft["val"]), (sft["train"], sft["eval"])
    sweep = {arm: [(lr, (f"{n}_lr{lr:g}", val, x, a.ft_steps, lr)) for lr in (a.lrs_full if arm == "full" else a.lrs_lora)]
             for arm, (n, x) in arms.items()}
    t1 = time.time()
    run_all(a, [j for runs in sweep.values() for _, j in runs])
    best = {arm: min((records(os.path.join(a.dir, j[0]), "eval")[-1][1], lr) for lr, j in runs)[1]
            for arm, runs in sweep.items()}
    chosen = {arm: os.path.join(a.dir, f"{n}_lr{best[arm]:g}") for arm, (n, _) in arms.items()}
    # the eval rows' loss of the base and of each chosen run's final weights: one step at a learning rate that
    # leaves the weights as they are
    run_all(a, [(f"eval_{n}", held, f"init: {{from: '{chosen[arm]}/ckpt/export'}}\n", 1, 1e-12)
                for arm, (n, _) in arms.items()] + [("base", held, init, 1, 1e-12)])
    print(f"fine-tunes: {time.time() - t1:.0f} s", flush=True)
    report(a, pre, os.path.join(a.dir, "base"),
           {arm: [(lr, os.path.join(a.dir, j[0])) for lr, j in runs] for arm, runs in sweep.items()}, best, chosen,
           {arm: os.path.join(a.dir, f"eval_{n}") for arm, (n, _) in arms.items()})


if __name__ == "__main__":
    main()
