#!/usr/bin/env python3
"""test_cli.py — build/qtrain's command line: --help on stdout with exit 0 naming every flag main.c
accepts, --version with the build's git commit, malformed --stop-after values and other usage errors
on stderr with exit 2."""
import os
import re
import subprocess
import sys

from qt_test import BUILD, ROOT, Skip, run_tests

QTRAIN = os.path.join(BUILD, "qtrain")


def qtrain(*args):
    if not os.access(QTRAIN, os.X_OK):
        raise Skip(f"{QTRAIN} not built")
    return subprocess.run([QTRAIN, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_help(tmp):
    flags = set(re.findall(r'"(--[a-z][a-z-]*)', open(os.path.join(ROOT, "src", "train", "main.c")).read()))
    assert {"--help", "--version", "--stop-after", "--set"} <= flags, f"flags found in main.c: {flags}"
    for arg in ("--help", "-h"):
        r = qtrain(arg)
        assert r.returncode == 0, f"qtrain {arg}: exit {r.returncode}, expected 0"
        assert r.stdout.startswith("usage: qtrain") and not r.stderr, f"qtrain {arg}: help not on stdout"
        missing = [f for f in sorted(flags) if not re.search(rf"(^|[\s,]){re.escape(f)}\b", r.stdout, re.M)]
        assert not missing, f"qtrain {arg} does not list {missing}"


def test_version(tmp):
    r = qtrain("--version")
    assert r.returncode == 0 and not r.stderr, f"exit {r.returncode}, stderr {r.stderr!r}"
    m = re.fullmatch(r"qtrain (\d+\.\d+\.\d+)(?: commit (\S+))?\n", r.stdout)
    assert m, f"unexpected --version output {r.stdout!r}"
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    if head.returncode == 0:  # built from a checkout: a commit of this history (HEAD unless committed since)
        assert m.group(2), f"no commit in {r.stdout!r}"
        sha = m.group(2).removesuffix("-dirty").rsplit("-g", 1)[-1]
        anc = subprocess.run(["git", "merge-base", "--is-ancestor", sha, "HEAD"], capture_output=True, cwd=ROOT)
        assert anc.returncode == 0, f"--version says commit {sha}, not in HEAD's ({head.stdout.strip()}) history"


def test_stop_after_errors(tmp):
    cfg = os.path.join(ROOT, "configs", "tiny-cpu.yaml")
    for bad in ("abc", "0", "-3", "12x", "", "1e3", "99999999999999999999999"):
        r = qtrain(cfg, "--stop-after", bad, "--set", f"data.train={tmp}/none_*.bin")  # never trains
        assert r.returncode == 2, f"--stop-after {bad!r}: exit {r.returncode}, expected 2"
        assert "--stop-after" in r.stderr and f'"{bad}"' in r.stderr, f"--stop-after {bad!r}: {r.stderr!r}"
    r = qtrain(cfg, "--stop-after")
    assert r.returncode == 2 and "--stop-after" in r.stderr, f"missing value: {r.returncode} {r.stderr!r}"


def test_usage_errors(tmp):
    for args in ((), ("--bogus",), ("a.yaml", "b.yaml"), ("a.yaml", "--set")):
        r = qtrain(*args)
        assert r.returncode == 2 and r.stderr and not r.stdout, f"qtrain {args}: exit {r.returncode}, " \
            f"stdout {r.stdout[:60]!r}, stderr {r.stderr[:60]!r}"


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
