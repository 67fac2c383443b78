#!/usr/bin/env python3
"""test_python_readme.py — the README's Python examples run as written: each is the ```python block
between `<!-- test:NAME -->` and `<!-- /test:NAME -->` in README.md's "## Python" section. The CPU
example runs verbatim on the quickstart's data (made here with the quickstart's own tokenize command,
in a scratch root beside the repository's configs/); the W&B example runs verbatim against a stand-in
`wandb` module that records what it is given; the GPU example runs on the CPU with its model, config
and corpus swapped for small ones. `BUILD=build python3 tests/test_python_readme.py`."""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_python as base  # noqa: E402
from qt_test import BUILD, ROOT, Skip, run_pytest  # noqa: E402

SHAKESPEARE = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt")


def snippet(name):
    """The ```python block between README.md's markers test:name (in its "## Python" section)."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(rf"<!-- test:{name} -->\n```python\n(.*?)```\n<!-- /test:{name} -->", section, re.S)
    assert m, f"README.md's Python section has no ```python block between <!-- test:{name} --> and <!-- /test:{name} -->"
    return m.group(1)


def quickstart_root(tmp):
    """A scratch root holding the repository's configs/ and the quickstart's data at
    runs/quickstart/data, made by tools/quickstart.sh's tokenize command (tinyshakespeare when present,
    else the quickstart's generated toy play). Returns its path."""
    root = os.path.join(tmp, "root")
    os.makedirs(root)
    os.symlink(os.path.join(ROOT, "configs"), os.path.join(root, "configs"))
    src = SHAKESPEARE
    if not os.path.exists(src):
        src = os.path.join(tmp, "corpus.txt")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "toy_corpus.py"), src, "--seed", "1234"],
                       check=True, capture_output=True)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tokenize"), "--byte-level", src, "--out",
                        os.path.join(root, "runs", "quickstart", "data"), "--eval-frac", "0.05"],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"tokenize: {r.stderr[-1000:]}"
    return root


def run_snippet(code, cwd, extra_path=()):
    """Runs code with `python3 -c` in cwd, qtrain from BUILD; returns the CompletedProcess."""
    path = os.pathsep.join([*extra_path, os.path.join(BUILD, "python")])
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=path))


def test_readme_cpu_example(tmp):
    """The CPU example, verbatim: it trains (the loss falls), evaluates and exports on the quickstart's
    data with configs/tiny-cpu.yaml."""
    base.need()
    code = snippet("python-cpu")
    root = quickstart_root(tmp)
    r = run_snippet(code, root)
    assert r.returncode == 0, f"the README's CPU example failed:\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}"
    steps = [line.split() for line in r.stdout.splitlines() if re.match(r"\d+ \d", line)]
    assert len(steps) >= 10 and [int(s[0]) for s in steps] == list(range(1, len(steps) + 1)), r.stdout[-1500:]
    first, last = float(steps[0][1]), float(steps[-1][1])
    assert last < first - 0.5, f"the loss did not fall: {first} -> {last}"
    evals = [line for line in r.stdout.splitlines() if line.startswith("eval loss ")]
    assert evals and float(evals[-1].split()[-1]) < first, evals
    assert os.path.exists(os.path.join(root, "runs", "py-cpu", "hf", "model.safetensors")), "no export"


# A stand-in for the wandb package: init() and log() are recorded in $FAKE_WANDB_OUT; the third log()
# raises, so the example stops after 3 steps of its 300 (its exception comes out of step()).
FAKE_WANDB = r"""
import json, os
class Stop(Exception):
    pass
def _write(rec):
    with open(os.environ["FAKE_WANDB_OUT"], "a") as f:
        f.write(json.dumps(rec) + "\n")
def init(**kw):
    _write({"init": kw})
_n = [0]
def log(data, step=None):
    _write({"log": data, "step": step})
    _n[0] += 1
    if _n[0] == 3:
        raise Stop("the test stops here")
"""


def test_readme_wandb_example(tmp):
    """The W&B example, verbatim, against a stand-in wandb: every step's metrics reach wandb.log at
    their step (loss, lr, grad_norm, tokens_per_s)."""
    base.need()
    code = snippet("python-wandb")
    assert len([line for line in code.splitlines() if line.strip()]) <= 6, "the W&B example is no longer short"
    root = quickstart_root(tmp)
    fake = os.path.join(tmp, "fake")
    os.makedirs(fake)
    open(os.path.join(fake, "wandb.py"), "w").write(FAKE_WANDB)
    out = os.path.join(tmp, "wandb.jsonl")
    os.environ["FAKE_WANDB_OUT"] = out
    try:
        r = run_snippet(code, root, extra_path=(fake,))
    finally:
        del os.environ["FAKE_WANDB_OUT"]
    assert "wandb.Stop: the test stops here" in r.stderr, f"the example did not reach wandb.log:\n{r.stderr[-3000:]}"
    recs = [json.loads(line) for line in open(out)]
    assert "init" in recs[0], recs[:1]
    logs = recs[1:]
    assert [x["step"] for x in logs] == [1, 2, 3] == [x["log"]["step"] for x in logs], logs
    for x in logs:
        assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= set(x["log"]), x
        assert x["log"]["loss"] > 0


def test_readme_gpu_example(tmp):
    """The GPU example runs on the CPU with a tokenizer trained here, test_python's small config and 4
    steps (its model, config, corpus, paths and step count swapped for these)."""
    qtrain, np = base.need()
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        raise Skip("the example tokenizes with HF tokenizers (pip install tokenizers)")
    code = snippet("python-gpu")
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([base.corpus(40000).decode("latin-1")],
                            trainers.BpeTrainer(vocab_size=250, special_tokens=["[UNK]", "<|endoftext|>"]))
    tok.save(os.path.join(tmp, "tokenizer.json"))
    with open(os.path.join(tmp, "corpus.txt"), "w") as f:
        f.write(base.corpus(40000).decode("latin-1"))
    cfg = base.setup_run(tmp)
    for a, b in (("models/qwen2.5-0.5b/tokenizer.json", f"{tmp}/tokenizer.json"), ('"models/qwen2.5-0.5b"', '""'),
                 ("configs/qwen2.5-0.5b-bf16.yaml", cfg), ('open("corpus.txt")', f'open("{tmp}/corpus.txt")'),
                 ("runs/py", f"{tmp}/py"), ("steps = 100", "steps = 4")):
        assert a in code, f"the README example no longer has {a!r}"
        code = code.replace(a, b)
    exec(compile(code, "README.md (Python example)", "exec"), {})
    assert os.path.exists(f"{tmp}/py/hf/model.safetensors"), "the example's export is missing"


if __name__ == "__main__":
    sys.exit(run_pytest(os.path.abspath(__file__), globals()))
