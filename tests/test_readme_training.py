#!/usr/bin/env python3
"""test_readme_training.py — the README's "Training" recipe, run line by line as written (between its
<!-- test:training --> and <!-- /test --> markers) in a copy of the tree: once as on a fresh clone, once
after `make quickstart` (tools/quickstart.sh, as small). The qtrain lines get smaller --set values
appended (later --set wins), nothing else: the first run 3 steps, the resume 2 more."""
import json
import os
import re
import shutil
import subprocess
import sys

from qt_test import BUILD, ROOT, Skip, run_tests

SMALL = ["--set", "optim.steps=3", "--set", "optim.warmup=1", "--set", "eval.every=2", "--set", "eval.batches=1",
         "--set", "data.micro_batch=2", "--set", "data.seq_len=32", "--set", "log.every=1"]
ENV = dict(os.environ, BUILD="build", OMP_NUM_THREADS="1")  # one thread: fast on a loaded 2-core machine


def snippet():
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- test:training[^>]*-->\s*```sh\n(.*?)```\s*<!-- /test -->", text, re.S)
    assert m, "README.md has no <!-- test:training --> ... <!-- /test --> block around a ```sh block"
    return [line for line in m.group(1).splitlines() if line.strip()]


def tree(tmp):
    """A copy of what a clone holds that the recipe uses, with the built binaries."""
    if not os.access(os.path.join(BUILD, "qtrain"), os.X_OK):
        raise Skip(f"{BUILD}/qtrain not built")
    try:
        import numpy  # noqa: F401 — tools/tokenize needs it
    except ImportError:
        raise Skip("tools/tokenize needs numpy")
    top = os.path.join(tmp, "clone")
    for d in ("tools", "configs"):
        shutil.copytree(os.path.join(ROOT, d), os.path.join(top, d), ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink(BUILD, os.path.join(top, "build"))
    with open(os.path.join(top, "my_corpus.txt"), "w") as f:
        for i in range(2000):
            f.write(f"Line {i}: the quick brown fox jumps over the lazy dog, {i * 7 % 13} times.\n")
    return top


def run_recipe(top):
    outs = []
    for line in snippet():
        cmd = line.split("#", 1)[0].strip()
        if cmd.startswith("tools/plot"):
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                print("  (tools/plot skipped: matplotlib is not installed)")
                continue
        extra = ""
        if cmd.startswith("build/qtrain") and "--resume" in cmd:
            extra = " --set optim.steps=5"
        elif cmd.startswith("build/qtrain"):
            extra = " " + " ".join(SMALL)
        r = subprocess.run(["bash", "-c", cmd + extra], cwd=top, capture_output=True, text=True, timeout=300, env=ENV)
        assert r.returncode == 0, f"README line `{line}` failed (exit {r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
        outs.append(r.stdout)
    return outs


def check_run(top, outs):
    assert any("evaluating on data/mine/eval_*.bin" in o for o in outs), "the eval did not score the recipe's data"
    recs = [json.loads(line) for line in open(os.path.join(top, "runs", "mine", "log.jsonl"))]
    configs = [r for r in recs if r["type"] == "config"]
    assert [c["resume"] for c in configs] == [False, True], configs
    assert [r["step"] for r in recs if r["type"] == "train"] == [1, 2, 3, 4, 5], recs
    assert configs[1]["config"]["data.micro_batch"] == 2, "the resume did not take the checkpoint's config"
    assert os.path.isfile(os.path.join(top, "runs", "mine", "ckpt", "ckpt_00000005.qtc"))


def test_training_fresh_clone(tmp):
    top = tree(tmp)
    check_run(top, run_recipe(top))


def test_training_after_quickstart(tmp):
    top = tree(tmp)
    r = subprocess.run(["bash", "tools/quickstart.sh", *SMALL], cwd=top, capture_output=True, text=True, timeout=300,
                       env=ENV)
    assert r.returncode == 0, f"quickstart: {r.stdout[-1500:]}\n{r.stderr[-1500:]}"
    qlog = open(os.path.join(top, "runs", "quickstart", "log.jsonl")).read()
    check_run(top, run_recipe(top))
    assert open(os.path.join(top, "runs", "quickstart", "log.jsonl")).read() == qlog, "the quickstart's log changed"


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
