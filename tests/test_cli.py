#!/usr/bin/env python3
"""test_cli.py — build/qtrain's command line: --help on stdout with exit 0 naming every flag main.c
accepts, --version with the build's git commit, malformed --stop-after values and other usage errors
on stderr with exit 2."""
import os
import re
import subprocess
import sys

from qt_test import BUILD, ROOT, Skip, cpu_only_build, run_tests

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


def plan_rows(out):
    """The rows of `qtrain --plan`: [(kind, MiB, place)], place 'GPU arena', 'GPU', 'pinned host' or 'host'."""
    rows = []
    for line in out.splitlines():
        m = re.match(r"  (.+?)\s+(\d+\.\d) MiB  (GPU arena|GPU|pinned host|host)$", line)
        if m:
            rows.append((m.group(1), float(m.group(2)), m.group(3)))
    return rows


def total(out, name):
    m = re.search(rf"^  {re.escape(name)}\s+(\d+\.\d) MiB", out, re.M)
    assert m, f"no {name!r} line in:\n{out}"
    return float(m.group(1))


def test_plan(tmp):
    """--plan without a GPU: every row with its place, totals that are the rows' sums, exit 0 when it fits
    the limits given, 3 with the total, the limit and the biggest items when not; --set applies."""
    cfg = "configs/qwen2.5-7b-fp8.yaml"
    r = qtrain("--plan", cfg, "--gpu-mem", "80", "--host-mem", "256")
    if cpu_only_build():  # the GPU rows are the GPU model's own code, left out of this build
        assert r.returncode == 1 and "built without CUDA: rebuild with the CUDA toolkit" in r.stderr, r.stderr
        raise Skip("the CPU-only build plans no GPU run (and says so)")
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}"
    rows = plan_rows(r.stdout)
    kinds = {k for k, _, _ in rows}
    for k in ("weights (bf16)", "gradients (fp32)", "fp8 weights (persistent)", "cuBLASLt workspace", "runtime reserve",
              "offloaded optimizer state", "checkpoint snapshot", "weight init buffer (fp32)", "step tokens"):
        assert k in kinds, f"--plan lacks the row {k!r}:\n{r.stdout}"
    arena = sum(b for _, b, w in rows if w == "GPU arena")
    gpu = arena + sum(b for _, b, w in rows if w == "GPU")
    host = sum(b for _, b, w in rows if w in ("pinned host", "host"))
    n = len(rows)
    assert abs(total(r.stdout, "arena total") - arena) <= 0.05 * n, f"arena {arena} vs {total(r.stdout, 'arena total')}"
    assert abs(total(r.stdout, "GPU total") - gpu) <= 0.05 * n and abs(total(r.stdout, "host total") - host) <= 0.05 * n
    # 7B with the optimizer offloaded: 2 + 4 bytes per parameter of weights and gradients on the GPU
    assert abs(dict((k, b) for k, b, _ in rows)["gradients (fp32)"] - 7615616512 * 4 / 2**20) < 1
    assert "GPU per device" in r.stdout and "--gpu-mem 80: fits" in r.stdout and "--host-mem 256: fits" in r.stdout
    r = qtrain("--plan", cfg, "--gpu-mem", "24", "--host-mem", "64")
    assert r.returncode == 3, f"exit {r.returncode}, expected 3 (does not fit)"
    assert "--gpu-mem 24: does not fit" in r.stdout and "--host-mem 64: does not fit" in r.stdout, r.stdout
    assert re.search(r"the GPU memory plan needs \d+\.\d\d GiB \(the CUDA context not counted\) but --gpu-mem 24 "
                     r"allows 24\.00 GiB; biggest items: gradients \(fp32\)", r.stderr), r.stderr
    # the config's own limit applies without --gpu-mem; --set changes the plan
    r = qtrain("--plan", cfg, "--set", "memory.gpu_limit_gib=24", "--host-mem", "256")
    assert r.returncode == 3 and "memory.gpu_limit_gib = 24" in r.stderr, r.stderr
    r2 = qtrain("--plan", cfg, "--set", "data.micro_batch=1", "--gpu-mem", "80", "--host-mem", "256")
    assert r2.returncode == 0 and total(r2.stdout, "arena total") < arena - 1000, "micro_batch 1 should shrink the arena"
    r = qtrain("--plan", "configs/tiny-cpu.yaml", "--set", "device=cpu")
    assert r.returncode == 0 and "weights, gradients, m, v (fp32)" in r.stdout and "no GPU used" in r.stdout, r.stdout
    for bad in (["--gpu-mem"], ["--gpu-mem", "0"], ["--host-mem", "x"]):
        r = qtrain("--plan", cfg, *bad)
        assert r.returncode == 2 and "expected a size in GiB" in r.stderr, f"{bad}: exit {r.returncode} {r.stderr}"


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
