#!/usr/bin/env python3
"""test_nodes_train.py — training across nodes on one host with 2 GPUs (skips without them or NCCL).

Two emulated nodes are two qtrain processes with CUDA_VISIBLE_DEVICES 0 and 1, NCCL forced onto its socket
transport over the loopback (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo), launched by
NODE_RANK/NNODES/MASTER_ADDR/MASTER_PORT: the path real nodes take over Ethernet.
- 2 nodes x 1 GPU train bitwise as one process with 2 GPUs, bf16 and fp8, parallel.zero 0..3 (and ZeRO-2
  over 2 micro-steps, fp8 ZeRO-3 with e4m3 gathers, ZeRO-1 with CUDA graphs): every logged loss and gradient
  norm, and the final checkpoint's weights, bf16 weights, Adam m and v, loader position and step. With ZeRO
  the state is sharded over the nodes, each node's shard one process's rank's (the checkpoint gathers them
  on node 0); the sum of two gradients is order-free, the gradient norm adds the same pieces' sums in the
  same order, the data are the same global micro-batches.
- 2 nodes x 2 GPUs stay within a stated bound of one process with 4 (the sums' orders differ); on 2 GPUs
  the 4 ranks share them.
- A run of 2 nodes stopped half way (--stop-after) resumes as one process with 2 GPUs and ends with the
  bits of the uninterrupted one-process run.
- A node killed with SIGKILL mid-run stops the other within 30 s, its message naming the lost node.
The tiny byte-level model (vocab 256) trains on tinyshakespeare ($QT_DATA_DIR, default ../shared/data,
else out/data) tokenized into the test's folder. Every case prints PASS/FAIL; about 3 minutes on 2 H200s."""
import glob
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

from qt_test import BUILD, ROOT, Skip, run_tests

QTRAIN = os.path.join(BUILD, "qtrain")
STEPS = 6
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "NNODES", "MASTER_ADDR",
               "MASTER_PORT", "CUDA_VISIBLE_DEVICES")
# micro_batch 4 x seq_len 64: 256 tokens a rank, so 2 ranks' embedding lookups are no cheaper than the
# table's gradient (qt_plan_lookups_pay) and one process sums the table in its bucket, as the nodes do
CONFIG = """model: {vocab_size: 256, hidden_size: 128, num_layers: 3, num_heads: 2, num_kv_heads: 1,
        intermediate_size: 96, max_seq_len: 64, tie_embeddings: false}
data: {train: '%(data)s/train_*.bin', seq_len: 64, micro_batch: 4, grad_accum: %(accum)d}
optim: {lr: 0.003, warmup: 2, steps: %(steps)d, schedule: cosine, grad_clip: 1.0}
eval: {every: 0}
checkpoint: {dir: '%(run)s/ckpt', every: 0, keep: 2}
log: {file: '%(run)s/log.jsonl', every: 1}
device: cuda
memory: {plan: manual}
perf: {matmul_autotune: false, cuda_graphs: %(graphs)s}
parallel: {gpus: %(gpus)d, zero: %(zero)d, overlap_comm: true, gather_dtype: %(gather)s}
%(precision)s
"""
FP8 = "precision: {matmul_dtype: e4m3, grad_dtype: e4m3}"
BLOBS = ("weights", "weights_bf16", "adam_m", "adam_v", "loader_pos", "step", "micro_batches_per_step")


def gpu_count():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))


def need_two_gpus():
    if not os.access(QTRAIN, os.X_OK):
        raise Skip(f"{QTRAIN} not built")
    if not os.path.exists(os.path.join(BUILD, "tests", "test_internode")):  # built only where NCCL is
        raise Skip("built without NCCL (comm/internode.c left out: no nccl.h / libnccl)")
    if gpu_count() < 2:
        raise Skip("needs 2 GPUs on this host")


def data_dir(tmp):
    """Byte-level shards of tinyshakespeare in tmp/data (made once per test)."""
    d = os.path.join(tmp, "data")
    if glob.glob(os.path.join(d, "train_*.bin")):
        return d
    src = os.environ.get("QT_DATA_DIR") or next(
        (p for p in (os.path.join(ROOT, "..", "shared", "data"), os.path.join(ROOT, "out", "data"))
         if os.path.exists(os.path.join(p, "tinyshakespeare.txt"))), None)
    if not src:
        raise Skip("tinyshakespeare.txt not found ($QT_DATA_DIR, ../shared/data, out/data)")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tokenize"), "--byte-level",
                        os.path.join(src, "tinyshakespeare.txt"), "--out", d, "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return d


def write_config(tmp, name, gpus, zero, fp8, steps=STEPS, accum=1, gather="bf16", graphs=False):
    run = os.path.join(tmp, name)
    os.makedirs(run, exist_ok=True)
    path = os.path.join(run, "run.yaml")
    with open(path, "w") as f:
        f.write(CONFIG % {"data": data_dir(tmp), "run": run, "steps": steps, "gpus": gpus, "zero": zero,
                          "accum": accum, "gather": gather, "graphs": "true" if graphs else "false",
                          "precision": FP8 if fp8 else ""})
    return run, path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(devices, **kv):
    e = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "OMPI_"))}
    e.update(CUDA_VISIBLE_DEVICES=devices, NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_SOCKET_IFNAME="lo")
    e.update({k: str(v) for k, v in kv.items()})
    return e


def one_process(cwd, *args, devices="0,1"):
    """qtrain as one process on `devices`; its output."""
    r = subprocess.run([QTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=180, env=env(devices))
    assert r.returncode == 0, f"one process: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


def start_nodes(cwd, *args, devices=("0", "1")):
    port = free_port()
    return [subprocess.Popen([QTRAIN, *args, "--nodes", "2"], cwd=cwd, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env(devices[k], NODE_RANK=k, NNODES=2, MASTER_ADDR="127.0.0.1",
                                                             MASTER_PORT=port)) for k in (0, 1)]


def two_nodes(cwd, *args, devices=("0", "1")):
    """qtrain as 2 nodes (GPU 0 and GPU 1 by default); node 0's output. A node still running after 180 s is killed."""
    ps = start_nodes(cwd, *args, devices=devices)
    outs = []
    try:
        for k, p in enumerate(ps):
            try:
                outs.append(p.communicate(timeout=180))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"node {k} still runs after 180 s")
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()
    for k, (p, (out, err)) in enumerate(zip(ps, outs)):
        assert p.returncode == 0, f"node {k}: exit {p.returncode}\n{out[-2000:]}\n{err[-2000:]}"
    return outs[0][0]


def blobs(path):
    """The checkpoint's blob hashes by name (ckpt.c: a 64-byte header, then 128-byte entries: name[96],
    i32 dtype, u32, u64 bytes, u64 offset, u64 XXH64 of the blob)."""
    with open(path, "rb") as f:
        head = f.read(64)
        assert head[:8] == b"QTCKPT01", f"{path}: not a checkpoint"
        count = struct.unpack_from("<I", head, 12)[0]
        table = f.read(128 * count)
    out = {}
    for i in range(count):
        e = table[128 * i:128 * (i + 1)]
        name = e[:96].split(b"\0", 1)[0].decode()
        nbytes, _, h = struct.unpack_from("<QQQ", e, 104)
        out[name] = (nbytes, h)
    return out


def last_ckpt(run):
    files = sorted(glob.glob(os.path.join(run, "ckpt", "ckpt_*.qtc")))
    assert files, f"no checkpoint in {run}/ckpt"
    return files[-1]


def records(run):
    """(loss, grad_norm) of each train record of the run's log."""
    out = []
    for line in open(os.path.join(run, "log.jsonl")):
        r = json.loads(line)
        if r.get("type") == "train":
            out.append((r["step"], r["loss"], r["grad_norm"]))
    return out


def same_state(a, b):
    """'' when checkpoints a and b hold the same bytes in every compared blob, else what differs."""
    ba, bb = blobs(a), blobs(b)
    diff = [n for n in BLOBS if n in ba or n in bb if ba.get(n) != bb.get(n)]
    return "" if not diff else f"{os.path.basename(a)} vs {os.path.basename(b)}: {', '.join(diff)} differ"


def test_nodes_match_one_process(tmp):
    """2 nodes x 1 GPU = 1 process x 2 GPUs, bitwise: bf16 and fp8, ZeRO 0..3 (with ZeRO the optimizer state is
    sharded over the two nodes, each node's shard that of one process's rank), ZeRO-2 with 2 micro-steps, fp8
    ZeRO-3 with e4m3 gathers (the abs-max a max over the nodes), ZeRO-1 with CUDA graphs (NCCL's calls
    captured in the micro-steps' graph segments)."""
    need_two_gpus()
    bad = []
    cases = [(fp8, zero, 1, "bf16", False) for fp8 in (0, 1) for zero in range(4)] + \
        [(0, 2, 2, "bf16", False), (1, 3, 1, "e4m3", False), (0, 1, 2, "bf16", True)]
    for fp8, zero, accum, gather, graphs in cases:
        tag = f"{'fp8' if fp8 else 'bf16'}_z{zero}" + (f"_accum{accum}" if accum > 1 else "") + \
            ("_e4m3_gathers" if gather != "bf16" else "") + ("_graphs" if graphs else "")
        ra, ca = write_config(tmp, "one_" + tag, 2, zero, fp8, accum=accum, gather=gather, graphs=graphs)
        rb, cb = write_config(tmp, "nodes_" + tag, 1, zero, fp8, accum=accum, gather=gather, graphs=graphs)
        t0 = time.time()
        one_process(tmp, ca)
        t1 = time.time()
        out = two_nodes(tmp, cb)
        t2 = time.time()
        why = same_state(last_ckpt(ra), last_ckpt(rb))
        la, lb = records(ra), records(rb)
        if not why and la != lb:
            why = f"logged (step, loss, grad norm) differ: {la} vs {lb}"
        if not why and zero and "ZeRO over every node's GPUs" not in out:
            why = "node 0's engine does not shard the state over the nodes"
        print(f"  {tag}: 1 process x 2 GPUs {t1 - t0:.1f} s, 2 nodes x 1 GPU {t2 - t1:.1f} s: "
              f"{'bitwise equal' if not why else why}")
        sys.stdout.flush()
        if why:
            bad.append(f"{tag}: {why}")
        shutil.rmtree(ra, ignore_errors=True)
        shutil.rmtree(rb, ignore_errors=True)
    assert not bad, "; ".join(bad)


def test_two_by_two_bounded(tmp):
    """2 nodes x 2 GPUs against 1 process x 4 GPUs, bf16 ZeRO 0..3 and fp8 ZeRO-1: the nodes sum
    (x0 + x1) + (x2 + x3) where the process sums ((x0 + x1) + x2) + x3, one fp32 rounding per gradient element
    apart, so the bound: every logged loss and gradient norm within 1e-3 (relative) of the process's over 6
    steps. With ZeRO GPU g's in-node piece is world pieces [2g, 2g + 2), the layout 2 x 1 never has. On a
    host of 2 GPUs the 4 ranks share them (parallel.devices: the process [0, 0, 1, 1], each node [0, 0] on its
    own GPU)."""
    need_two_gpus()
    shared = gpu_count() < 4
    one_devs = ("0,1", ["--set", "parallel.devices=[0,0,1,1]"]) if shared else ("0,1,2,3", [])
    node_devs = (("0", "1"), ["--set", "parallel.devices=[0,0]"]) if shared else (("0,1", "2,3"), [])
    bad = []
    for fp8, zero in [(0, 0), (0, 1), (0, 2), (0, 3), (1, 1)]:
        tag = f"{'fp8' if fp8 else 'bf16'}_z{zero}"
        ra, ca = write_config(tmp, "one_4_" + tag, 4, zero, fp8)
        rb, cb = write_config(tmp, "nodes_2x2_" + tag, 2, zero, fp8)
        one_process(tmp, ca, *one_devs[1], devices=one_devs[0])
        two_nodes(tmp, cb, *node_devs[1], devices=node_devs[0])
        la, lb = records(ra), records(rb)
        assert len(la) == len(lb) == STEPS, f"{tag}: {len(la)} / {len(lb)} train records, expected {STEPS}"
        worst = max(max(abs(x[1] - y[1]) / abs(x[1]), abs(x[2] - y[2]) / abs(x[2])) for x, y in zip(la, lb))
        print(f"  {tag}: 2 nodes x 2 GPUs vs 1 process x 4 GPUs{' (ranks sharing 2 GPUs)' if shared else ''}: "
              f"largest relative difference of a loss or gradient norm {worst:.2e}")
        sys.stdout.flush()
        if worst > 1e-3:
            bad.append(f"{tag}: the losses and norms differ by up to {worst:.2e} (bound 1e-3): {la} vs {lb}")
    assert not bad, "; ".join(bad)


def test_resume_two_nodes_on_one(tmp):
    """2 nodes stopped at step 3 of 6, resumed as 1 process x 2 GPUs: the bits of the uninterrupted run."""
    need_two_gpus()
    ra, ca = write_config(tmp, "full", 2, 1, 0)
    one_process(tmp, ca)
    rb, cb = write_config(tmp, "split", 1, 1, 0)
    two_nodes(tmp, cb, "--stop-after", str(STEPS // 2))
    assert os.path.basename(last_ckpt(rb)) == f"ckpt_{STEPS // 2:08d}.qtc", last_ckpt(rb)
    one_process(tmp, "--resume", os.path.join(rb, "ckpt"), "--nodes", "1", "--set", "parallel.gpus=2")
    why = same_state(last_ckpt(ra), last_ckpt(rb))
    print(f"  2 nodes to step {STEPS // 2}, 1 process x 2 GPUs to {STEPS}, vs 1 process throughout: "
          f"{'bitwise equal' if not why else why}")
    assert not why, why


def test_killed_node_stops_the_other(tmp):
    """SIGKILL of node 1 mid-run: node 0 fails within 30 s, naming node 1."""
    need_two_gpus()
    run, cfg = write_config(tmp, "kill", 1, 1, 0, steps=100000)
    ps = start_nodes(tmp, cfg)
    try:
        deadline, seen = time.time() + 120, ""
        while time.time() < deadline and "step      3/" not in seen:  # node 1's third step is logged
            line = ps[1].stdout.readline()
            if not line:
                break
            seen += line
        assert "step      3/" in seen, f"node 1 never reached step 3: {seen[-1500:]}"
        ps[1].send_signal(signal.SIGKILL)
        t0 = time.time()
        try:
            out, err = ps[0].communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("node 0 still runs 30 s after node 1 was killed")
        dt = time.time() - t0
        print(f"  node 0 stopped {dt:.1f} s after node 1's SIGKILL, exit {ps[0].returncode}: "
              f"{err.strip().splitlines()[-1] if err.strip() else '(no message)'}")
        assert ps[0].returncode not in (0, None), f"node 0 exited {ps[0].returncode}"
        assert "node 1" in err, f"node 0's message does not name node 1: {err[-1500:]}"
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(run_tests(globals(), sys.argv[1:]))
