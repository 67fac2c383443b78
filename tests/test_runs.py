#!/usr/bin/env python3
"""test_runs.py — runs that do not collide (CPU, tiny): run.dir moves every path; a fresh run never writes
over another run's log and a running run's log is locked; a resumed run appends after cutting a partial
record; --resume takes a folder, a run.dir or a file and the checkpoint's config (only --set changes);
a refused start leaves no folder; the CLI's --gpu-mem and --plan on a CPU machine."""
import fcntl
import json
import os
import shutil
import subprocess
import sys

from qt_test import BUILD, ROOT, Skip, run_tests

QTRAIN = os.path.join(BUILD, "qtrain")
CFG = os.path.join(ROOT, "configs", "tiny-cpu.yaml")
SMALL = ["--set", "device=cpu", "--set", "optim.warmup=1", "--set", "eval.every=2", "--set", "eval.batches=1",
         "--set", "data.micro_batch=2", "--set", "data.seq_len=32", "--set", "log.every=1"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def qtrain(tmp, *args):
    if not os.access(QTRAIN, os.X_OK):
        raise Skip(f"{QTRAIN} not built")
    return subprocess.run([QTRAIN, *args], capture_output=True, text=True, cwd=tmp, timeout=300, env=ENV)


def data_args(tmp):
    """Byte-level shards in tmp/data/mine (made once); the --set that trains on them."""
    d = os.path.join(tmp, "data", "mine")
    if not os.path.isdir(d):
        os.makedirs(d)
        src = os.path.join(tmp, "c.txt")
        with open(src, "w") as f:
            f.write("".join(f"line {i}: all the world's a stage, {i % 11}\n" for i in range(1500)))
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tokenize"), "--byte-level", src, "--out", d,
                            "--eval-frac", "0.1", "--quiet"], capture_output=True, text=True)
        if r.returncode and "numpy" in r.stderr:
            raise Skip("tools/tokenize needs numpy")
        assert r.returncode == 0, r.stderr
    return ["--set", "data.train=data/mine/train_*.bin"]


def train(tmp, run, *extra, steps=2):
    return qtrain(tmp, CFG, "--set", f"run.dir={run}", *data_args(tmp), *SMALL, "--set", f"optim.steps={steps}", *extra)


def lines(path):
    return open(path).read().splitlines()


def test_run_dir_moves_everything(tmp):
    r = train(tmp, "runs/a")
    assert r.returncode == 0, r.stderr
    assert "evaluating on data/mine/eval_*.bin" in r.stdout, r.stdout  # data.eval from data.train
    for p in ("runs/a/ckpt/ckpt_00000002.qtc", "runs/a/log.jsonl", "runs/a/ckpt/export/model.safetensors"):
        assert os.path.exists(os.path.join(tmp, p)), p
    r = train(tmp, "runs/b", "--set", "checkpoint.dir=elsewhere")  # an explicit key still wins
    assert r.returncode == 0 and os.path.isdir(os.path.join(tmp, "elsewhere")), r.stderr
    assert os.path.isfile(os.path.join(tmp, "runs/b/log.jsonl"))


def test_fresh_run_never_overwrites_a_log(tmp):
    assert train(tmp, "runs/a").returncode == 0
    before = open(os.path.join(tmp, "runs/a/log.jsonl")).read()
    r = train(tmp, "runs/b", "--set", "log.file=runs/a/log.jsonl")  # another checkpoint dir, the same log
    assert r.returncode == 1 and "log.file: runs/a/log.jsonl holds another run's log" in r.stderr, r.stderr
    assert open(os.path.join(tmp, "runs/a/log.jsonl")).read() == before, "the other run's log changed"
    assert not os.path.exists(os.path.join(tmp, "runs/b")), "the refused start left its folder"
    r = train(tmp, "runs/a")  # the same run.dir again: its checkpoints refuse it
    assert r.returncode == 1 and "already holds" in r.stderr and "--resume" in r.stderr, r.stderr
    assert open(os.path.join(tmp, "runs/a/log.jsonl")).read() == before
    # an attempt of this run folder that saved nothing (killed before its first checkpoint): a fresh run
    # may start there again, and appends to its log
    for f in os.listdir(os.path.join(tmp, "runs/a/ckpt")):
        if f.startswith("ckpt_"):
            os.unlink(os.path.join(tmp, "runs/a/ckpt", f))
    r = train(tmp, "runs/a")
    assert r.returncode == 0, r.stderr
    after = open(os.path.join(tmp, "runs/a/log.jsonl")).read()
    assert after.startswith(before) and after.count('"type":"config"') == 2, after[len(before):][:300]


def test_start_killed_before_its_first_record(tmp):
    """A start killed between creating its log and completing the config record leaves an empty log or a part
    of a line: the same command starts again (the log emptied, no warning), and another log is still refused."""
    for left in ("", '{"type":"config","time":"2026-'):
        os.makedirs(os.path.join(tmp, "runs/k"), exist_ok=True)
        with open(os.path.join(tmp, "runs/k/log.jsonl"), "w") as f:
            f.write(left)
        r = train(tmp, "runs/k")
        assert r.returncode == 0 and "warning" not in r.stderr, (left, r.stderr)
        log = lines(os.path.join(tmp, "runs/k/log.jsonl"))
        assert log[0].startswith('{"type":"config"') and sum('"type":"config"' in l for l in log) == 1, log[:2]
        shutil.rmtree(os.path.join(tmp, "runs/k"))


def test_running_runs_log_is_locked(tmp):
    assert train(tmp, "runs/a").returncode == 0
    log = os.path.join(tmp, "runs/a/log.jsonl")
    before = open(log).read()
    with open(log) as held:  # what a running qtrain holds on its log
        fcntl.flock(held, fcntl.LOCK_EX)
        r = qtrain(tmp, "--resume", "runs/a", "--set", "optim.steps=3")
        assert r.returncode == 1 and "is in use by another run" in r.stderr, r.stderr
        r = train(tmp, "runs/b", "--set", "log.file=runs/a/log.jsonl")
        assert r.returncode == 1 and "is in use by another run" in r.stderr, r.stderr
    assert open(log).read() == before


def test_fifo_log_refused(tmp):
    """A FIFO given as log.file is refused at start instead of blocking in open()."""
    os.mkfifo(os.path.join(tmp, "fifo"))
    r = train(tmp, "runs/f", "--set", "log.file=fifo")
    assert r.returncode == 1 and "log.file: fifo: expected a regular file, got a FIFO" in r.stderr, r.stderr


def test_resume_appends_after_a_partial_record(tmp):
    assert train(tmp, "runs/a").returncode == 0
    log = os.path.join(tmp, "runs/a/log.jsonl")
    n = len(lines(log))
    with open(log, "a") as f:
        f.write('{"type":"train","step":3,"lo')  # a full disk's last write
    r = qtrain(tmp, "--resume", "runs/a", "--set", "optim.steps=4")
    assert r.returncode == 0, r.stderr
    assert "ended inside a record" in r.stderr, r.stderr
    recs = [json.loads(line) for line in lines(log)]  # every line parses
    assert len(recs) > n and recs[n]["type"] == "config" and recs[n]["resume"] is True, recs[n:]
    assert [x["step"] for x in recs if x["type"] == "train"] == [1, 2, 3, 4]


def test_resume_takes_the_checkpoints_config(tmp):
    assert train(tmp, "runs/a").returncode == 0
    # a folder: the run.dir, the checkpoint folder, then one checkpoint file; no --set repeated
    for which, steps in (("runs/a", 3), ("runs/a/ckpt", 4), ("runs/a/ckpt/ckpt_00000004.qtc", 5)):
        r = qtrain(tmp, "--resume", which, "--set", f"optim.steps={steps}")
        assert r.returncode == 0, f"--resume {which}: {r.stderr}"
        assert f"at step {steps - 1}" in r.stdout, r.stdout
    rec = [json.loads(x) for x in lines(os.path.join(tmp, "runs/a/log.jsonl")) if '"config"' in x][-1]
    assert rec["config"]["data.seq_len"] == 32 and rec["config"]["data.micro_batch"] == 2, rec["config"]
    # the config file with a bare --resume: the file locates the run, the checkpoint's keys train
    r = qtrain(tmp, CFG, "--set", "run.dir=runs/a", "--resume", "--set", "optim.steps=6")
    assert r.returncode == 0, r.stderr
    # a --set that changes the run is still checked
    r = qtrain(tmp, "--resume", "runs/a", "--set", "optim.steps=7", "--set", "data.seq_len=16")
    assert r.returncode == 1 and "data.seq_len: checkpoint 32, config 16" in r.stderr, r.stderr


def test_refused_start_leaves_no_folder(tmp):
    data_args(tmp)
    r = qtrain(tmp, CFG, "--set", "run.dir=runs/x", "--set", "data.train=data/none_*.bin", *SMALL)
    assert r.returncode == 1 and "data.train: no files match data/none_*.bin" in r.stderr, r.stderr
    r = qtrain(tmp, CFG, "--set", "run.dir=runs/x", *SMALL)
    assert r.returncode == 1 and "data.train: not set" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(tmp, "runs")), os.listdir(os.path.join(tmp, "runs"))
    assert train(tmp, "runs/a").returncode == 0  # refused later, by the used checkpoint folder: no event file
    r = train(tmp, "runs/a", "--set", "log.tensorboard=runs/tb")
    assert r.returncode == 1 and "already holds" in r.stderr, r.stderr
    assert sorted(os.listdir(os.path.join(tmp, "runs"))) == ["a"], os.listdir(os.path.join(tmp, "runs"))


def test_gpu_mem_needs_plan_and_cpu_plan(tmp):
    r = qtrain(tmp, CFG, "--gpu-mem", "8")
    assert r.returncode == 2 and "--gpu-mem is a limit of --plan only" in r.stderr, r.stderr
    r = qtrain(tmp, CFG, "--host-mem", "8", "--set", "data.train=x")
    assert r.returncode == 2 and "--host-mem is a limit of --plan only" in r.stderr, r.stderr
    if os.path.exists("/dev/nvidia0"):
        raise Skip("a GPU is visible: device auto plans the GPU run")
    r = qtrain(tmp, "--plan", CFG)
    assert r.returncode == 0 and "the CPU plan" in r.stdout and "predicted on default" not in r.stdout, r.stdout


def test_data_dir_ignored_by_git(tmp):
    r = subprocess.run(["git", "check-ignore", "-q", "data/mine/train_000000.bin"], cwd=ROOT)
    if r.returncode == 128:
        raise Skip("not a git checkout")
    assert r.returncode == 0, "data/ (where the README's recipe tokenizes) is not ignored by git"


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
