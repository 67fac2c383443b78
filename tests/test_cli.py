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


# The 7B config's rows as a hand-made plan: memory.plan manual, the memory keys of test_stores' 7B table.
MANUAL_7B = ("--set", "memory.plan=manual", "--set", "data.micro_batch=8", "--set", "memory.offload_optimizer=true",
             "--set", "memory.recompute=[ffn,norm]", "--set", "memory.lmhead_chunks=4", "--set", "perf.cuda_graphs=true")


def test_plan(tmp):
    """--plan without a GPU: every row with its place, totals that are the rows' sums, exit 0 when it fits
    the limits given, 3 with the total, the limit and the biggest items when not; --set applies."""
    cfg = "configs/qwen2.5-7b-fp8.yaml"
    r = qtrain("--plan", cfg, *MANUAL_7B, "--gpu-mem", "80", "--host-mem", "256")
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
    r = qtrain("--plan", cfg, *MANUAL_7B, "--gpu-mem", "24", "--host-mem", "64")
    assert r.returncode == 3, f"exit {r.returncode}, expected 3 (does not fit)"
    assert "--gpu-mem 24: does not fit" in r.stdout and "--host-mem 64: does not fit" in r.stdout, r.stdout
    assert re.search(r"the GPU memory plan needs \d+\.\d\d GiB \(the CUDA context not counted\) but --gpu-mem 24 "
                     r"allows 24\.00 GiB; biggest items: gradients \(fp32\)", r.stderr), r.stderr
    # the config's own limit applies without --gpu-mem; --set changes the plan
    r = qtrain("--plan", cfg, *MANUAL_7B, "--set", "memory.gpu_limit_gib=24", "--host-mem", "256")
    assert r.returncode == 3 and "memory.gpu_limit_gib = 24" in r.stderr, r.stderr
    r2 = qtrain("--plan", cfg, *MANUAL_7B, "--set", "data.micro_batch=1", "--gpu-mem", "80", "--host-mem", "256")
    assert r2.returncode == 0 and total(r2.stdout, "arena total") < arena - 1000, "micro_batch 1 should shrink the arena"
    r = qtrain("--plan", "configs/tiny-cpu.yaml", "--set", "device=cpu")
    assert r.returncode == 0 and "weights, gradients, m, v (fp32)" in r.stdout and "no GPU used" in r.stdout, r.stdout
    for bad in (["--gpu-mem"], ["--gpu-mem", "0"], ["--host-mem", "x"]):
        r = qtrain("--plan", cfg, *bad)
        assert r.returncode == 2 and "expected a size in GiB" in r.stderr, f"{bad}: exit {r.returncode} {r.stderr}"



HINT = re.compile(r"^  (.+) blocks? it(?: \(none alone\))?; with((?: --set \S+=auto)+): (\d+\.\d\d) GiB GPU, "
                  r"(\d+\.\d) GiB host, (\d+) tokens/s predicted \((micro_batch \d+ x grad_accum \d+), ", re.M)
CHOSEN = re.compile(r"^  chosen (micro_batch +\d+ x grad_accum +\d+), .*: (\d+\.\d\d) GiB GPU, (\d+\.\d) GiB host, "
                    r"(\d+) tokens/s predicted$", re.M)


def test_plan_hints(tmp):
    """memory.plan: auto (the default) that finds no plan under the config's keys: `--plan` exits 3 and names
    the keys that block it, each with the plan the search finds without it; every hint equals what a real
    `--plan` with the hint's --set prints as its chosen plan (micro-batch, GPU and host GiB, tokens/s), and
    that plan fits. The shipped 7B and 14B configs at 24 / 16 / 12 GiB, with the hand-made 7B plan's keys
    (and CUDA graphs) as the constraints, and 7B bf16 with CUDA graphs and the optimizer state on the GPU (two keys
    that block it together at 16 and 12 GiB); budgets given, so no GPU is needed."""
    if cpu_only_build():
        raise Skip("the CPU-only build plans no GPU run")
    cases = [("configs/qwen2.5-7b-fp8.yaml", MANUAL_7B[2:]), ("configs/qwen2.5-14b-fp8.yaml", MANUAL_7B[2:]),
             ("configs/qwen2.5-7b-bf16.yaml", ("--set", "perf.cuda_graphs=true", "--set", "memory.offload_optimizer=false"))]
    checked = 0
    for cfg, keys in cases:
        for gib in ("24", "16", "12"):
            budget = ("--gpu-mem", gib, "--host-mem", "256")
            r = qtrain("--plan", cfg, *keys, *budget)
            assert r.returncode == 3, f"{cfg} at {gib} GiB: exit {r.returncode}, expected 3 (no plan under the keys)\n{r.stderr}"
            assert "memory.plan: auto: no plan fits" in r.stderr, r.stderr
            hints = HINT.findall(r.stderr)
            assert hints, f"{cfg} at {gib} GiB: no hint in\n{r.stderr}"
            for names, sets, gpu, host, tps, mb in hints:
                for key in re.findall(r"--set (\S+)=auto", sets):  # every key a hint drops is one the config gave
                    assert key in " ".join(keys), f"{cfg}: the hint drops {key}, which the config does not give"
                r2 = qtrain("--plan", cfg, *keys, *sets.split(), *budget)
                assert r2.returncode == 0, f"{cfg} at {gib} GiB with{sets}: exit {r2.returncode}\n{r2.stderr[-1500:]}"
                m = CHOSEN.search(r2.stdout)
                assert m, f"no chosen plan in\n{r2.stdout[:2000]}"
                got = (re.sub(r" +", " ", m.group(1)), m.group(2), m.group(3), m.group(4))
                assert got == (mb, gpu, host, tps), f"{cfg} at {gib} GiB, hint '{names}': {(mb, gpu, host, tps)}, " \
                    f"--plan with{sets}: {got}"
                assert float(gpu) <= float(gib), f"{cfg}: the hint's plan {gpu} GiB does not fit {gib} GiB"
                checked += 1
    print(f"{checked} hints held to the --plan of their change")


def test_plan_budget(tmp):
    """--plan without --gpu-mem / --host-mem names the budgets it checked against and where they come from:
    the GPU's (free memory less the margin, or without a GPU the probe's memory less it, capped by
    memory.gpu_limit_gib) and the host's (memory.host_limit_gib, else MemAvailable)."""
    if cpu_only_build():
        raise Skip("the CPU-only build plans no GPU run")
    r = qtrain("--plan", "configs/qwen2.5-0.5b-bf16.yaml")
    assert re.search(r"^  GPU budget \d+\.\d\d GiB per GPU: (free on the GPU now \(cudaMemGetInfo: \d+\.\d\d GiB\) less "
                     r"a 1 GiB margin|the GPU's \d+\.\d GiB \(.*; no free memory measured\) less a 1 GiB margin)$",
                     r.stdout, re.M), r.stdout[:3000]
    assert re.search(r"^  host budget \d+\.\d\d GiB: MemAvailable \(/proc/meminfo", r.stdout, re.M), r.stdout[:3000]
    r = qtrain("--plan", "configs/qwen2.5-0.5b-bf16.yaml", "--set", "memory.gpu_limit_gib=30", "--set",
               "memory.host_limit_gib=100")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^  GPU budget 30\.00 GiB per GPU: memory\.gpu_limit_gib = 30$", r.stdout, re.M), r.stdout[:3000]
    assert re.search(r"^  host budget 100\.00 GiB: memory\.host_limit_gib = 100$", r.stdout, re.M), r.stdout[:3000]
    m = CHOSEN.search(r.stdout)
    assert m and float(m.group(2)) <= 30, f"auto's plan does not keep to the 30 GiB cap:\n{r.stdout[:3000]}"


def test_auto_default(tmp):
    """memory.plan: auto is the default of a GPU run: a shipped config that leaves the memory keys out gets
    the planner's choice; a CPU run takes its keys as given (no planner), and memory.plan: manual too."""
    if cpu_only_build():
        raise Skip("the CPU-only build plans no GPU run")
    cfg = "configs/qwen2.5-0.5b-bf16.yaml"
    r = qtrain("--plan", cfg, "--gpu-mem", "40", "--host-mem", "256")
    assert r.returncode == 0 and re.search(r"^qtrain: memory.plan: auto: \d+ plans fit", r.stdout, re.M), r.stdout[:2000]
    m = CHOSEN.search(r.stdout)
    assert m and float(m.group(2)) <= 40, r.stdout[:2000]
    assert re.search(rf"micro-batch {m.group(1).split()[1]} x 1024", r.stdout), "the plan printed is not the one chosen"
    for extra in (("--set", "device=cpu"), ("--set", "memory.plan=manual", "--set", "data.micro_batch=8")):
        r = qtrain("--plan", cfg, *extra, "--gpu-mem", "40", "--host-mem", "256")
        assert r.returncode == 0 and "memory.plan: auto" not in r.stdout, f"{extra}: {r.stdout[:1500]}"
        assert "micro-batch 8 x 1024, grad_accum 64" in r.stdout, f"{extra}: {r.stdout[:600]}"


PREDICTED = re.compile(r"^  GPU per device +(\d+\.\d) MiB .*\n.*\n  predicted on .*: (\d+) tokens/s", re.M)


def test_plan_lora(tmp):
    """memory.plan: auto plans LoRA runs: QLoRA (an NF4 base) over the shipped 7B config at 12 / 16 / 24 GiB and a bf16
    base at 24 GiB: `--plan` exits 0 with a chosen plan under the budget, and the plan it then prints (the run's
    rows, the cost model's step) is that plan: its GPU GiB and predicted tokens/s. A bf16 base at 12 GiB fits by
    streaming the base from host memory (weights offloaded); kept resident (`memory.offload: []`) it fits no plan:
    exit 3, the hint names lora.base_dtype, and a `--plan` with the hint's --set prints the hint's plan."""
    if cpu_only_build():
        raise Skip("the CPU-only build plans no GPU run")
    cfg, lora = "configs/qwen2.5-7b-bf16.yaml", ("--set", "lora.rank=16", "--set", "lora.alpha=32")
    nf4 = ("--set", "lora.base_dtype=nf4")
    for extra, gib in ((nf4, "12"), (nf4, "16"), (nf4, "24"), ((), "24")):
        r = qtrain("--plan", cfg, *lora, *extra, "--gpu-mem", gib, "--host-mem", "64")
        assert r.returncode == 0, f"{extra} at {gib} GiB: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-1500:]}"
        assert re.search(r"^qtrain: memory.plan: auto: \d+ plans fit for LoRA rank 16 over a frozen (nf4|bf16) base", r.stdout,
                         re.M), r.stdout[:1500]
        m, p = CHOSEN.search(r.stdout), PREDICTED.search(r.stdout)
        assert m and p, r.stdout[-3000:]
        assert float(m.group(2)) <= float(gib), f"{extra} at {gib} GiB: the chosen plan needs {m.group(2)} GiB"
        assert f"{float(p.group(1)) / 1024:.2f}" == m.group(2) and p.group(2) == m.group(4), \
            f"{extra} at {gib} GiB: chosen {m.group(2)} GiB, {m.group(4)} tokens/s; --plan printed {p.group(1)} MiB, " \
            f"{p.group(2)} tokens/s"
    r = qtrain("--plan", cfg, *lora, "--gpu-mem", "12", "--host-mem", "64")
    m = CHOSEN.search(r.stdout)
    assert r.returncode == 0 and m and "weights offloaded" in m.group(0), \
        f"bf16 base at 12 GiB: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
    lora = lora + ("--set", "memory.offload=[]")
    r = qtrain("--plan", cfg, *lora, "--gpu-mem", "12", "--host-mem", "64")
    assert r.returncode == 3, f"bf16 base at 12 GiB, resident: exit {r.returncode}\n{r.stderr[-1500:]}"
    h = re.search(r"^  lora.base_dtype: bf16 blocks it; with((?: --set \S+)+): (\d+\.\d\d) GiB GPU, (\d+\.\d) GiB host, "
                  r"(\d+) tokens/s predicted", r.stderr, re.M)
    assert h, r.stderr
    r2 = qtrain("--plan", cfg, *lora, *h.group(1).split(), "--gpu-mem", "12", "--host-mem", "64")
    m = CHOSEN.search(r2.stdout)
    assert r2.returncode == 0 and m and (m.group(2), m.group(3), m.group(4)) == h.group(2, 3, 4), \
        f"the hint {h.group(0)}\n--plan with{h.group(1)}: {r2.stdout[:1500]}"


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
