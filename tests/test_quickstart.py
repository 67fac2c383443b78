#!/usr/bin/env python3
"""test_quickstart.py — `make quickstart`'s corpus choice (tools/quickstart.sh --prepare-only, no
training) in a copy of tools/: tinyshakespeare from ../shared/data when present, else the generated toy
play, the same bytes everywhere; both cases say loudly which corpus and the README's figure for it."""
import hashlib
import os
import re
import shutil
import subprocess
import sys

from qt_test import ROOT, run_tests

TOY_SHA256 = "815ba8c21d803abe123d9df4ce615197f4d54078062606c06f1053842aa7ba4e"  # toy_corpus.py --seed 1234


def quickstart(top):
    """Copies the scripts to top/repo/tools and runs quickstart.sh --prepare-only there."""
    tools = os.path.join(top, "repo", "tools")
    os.makedirs(tools)
    for f in ("quickstart.sh", "toy_corpus.py", "tokenize"):
        if os.path.exists(os.path.join(ROOT, "tools", f)):  # a missing one fails the run below
            shutil.copy(os.path.join(ROOT, "tools", f), tools)
    pkg = os.path.join(ROOT, "tools", "qt_tokenize")  # tools/tokenize's package, where it has one
    if os.path.isdir(pkg):
        shutil.copytree(pkg, os.path.join(tools, "qt_tokenize"), ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run(["bash", os.path.join(tools, "quickstart.sh"), "--prepare-only"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"quickstart.sh --prepare-only: exit {r.returncode}\n{r.stdout}{r.stderr}"
    m = re.search(r"^quickstart: corpus: (.*); the README's final eval loss for it: about ([0-9.]+)$", r.stdout, re.M)
    assert m, f"no corpus line in:\n{r.stdout}"
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert f"about {m.group(2)}" in readme, f"README does not give the figure {m.group(2)} for {m.group(1)}"
    data = os.path.join(top, "repo", "runs", "quickstart", "data")
    assert os.path.exists(os.path.join(data, "train_000000.bin")), "no train shard"
    return r.stdout, m.group(1)


def test_bare_clone_generates_toy_play(tmp):
    out, corpus = quickstart(tmp)   # no tmp/shared: as in a fresh clone
    assert "not found" in out and "toy play" in corpus, f"corpus: {corpus}\n{out}"
    with open(os.path.join(tmp, "repo", "runs", "quickstart", "corpus.txt"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    assert sha == TOY_SHA256, f"toy corpus sha256 {sha}, expected {TOY_SHA256}: not the documented corpus"


def test_shared_tinyshakespeare_used(tmp):
    os.makedirs(os.path.join(tmp, "shared", "data"))
    text = "FIRST CITIZEN:\nBefore we proceed any further, hear me speak.\n\n" * 200
    with open(os.path.join(tmp, "shared", "data", "tinyshakespeare.txt"), "w") as f:
        f.write(text)
    out, corpus = quickstart(tmp)
    assert "tinyshakespeare" in corpus and f"{len(text)} bytes" in corpus and "not found" not in out, out
    assert not os.path.exists(os.path.join(tmp, "repo", "runs", "quickstart", "corpus.txt")), "generated anyway"


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
