#!/usr/bin/env python3
"""test_tensorboard.py — log.tensorboard: a CPU run's event file read back with the tensorboard
package's own reader (record CRCs checked), holding every logged step's scalars, equal to the JSONL
log's values. Skips with a message when the tensorboard package is missing (pip install tensorboard)."""
import glob
import json
import os
import subprocess
import sys

from qt_test import BUILD, ROOT, Skip, run_tests


def make_shards(tmp):
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("To be, or not to be, that is the question.\n" * 400)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tokenize"), "--byte-level", corpus, "--out", data,
                        "--eval-frac", "0.1", "--quiet"], capture_output=True, text=True)
    if r.returncode and "numpy" in r.stderr:
        raise Skip("tools/tokenize needs numpy")
    assert r.returncode == 0, r.stderr
    return data


def test_events_read_back(tmp):
    try:
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.util import tensor_util
    except ImportError:
        raise Skip("the tensorboard package is not installed (pip install tensorboard)")
    qtrain = os.path.join(BUILD, "qtrain")
    if not os.access(qtrain, os.X_OK):
        raise Skip(f"{qtrain} not built")
    data = make_shards(tmp)
    run = os.path.join(tmp, "run")
    r = subprocess.run([qtrain, os.path.join(ROOT, "configs", "tiny-cpu.yaml"), "--set", "device=cpu",
                        "--set", f"run.dir={run}", "--set", f"data.train={data}/train_*.bin", "--set", "optim.steps=4",
                        "--set", "optim.warmup=1", "--set", "log.every=1", "--set", "eval.every=2",
                        "--set", "eval.batches=1", "--set", "data.micro_batch=2", "--set", f"log.tensorboard={run}/tb"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    files = glob.glob(os.path.join(run, "tb", "events.out.tfevents.*"))
    assert len(files) == 1, files
    events = list(event_file_loader.EventFileLoader(files[0]).Load())
    assert events[0].file_version == "brain.Event:2", events[0]
    got = {}
    for ev in events[1:]:
        for v in ev.summary.value:  # the loader gives simple_value scalars as tensors (data_compat)
            got[(v.tag, ev.step)] = float(tensor_util.make_ndarray(v.tensor)) if v.HasField("tensor") else v.simple_value
            assert ev.wall_time > 1.6e9, ev
    log = [json.loads(line) for line in open(os.path.join(run, "log.jsonl"))]
    want = {}
    for rec in log:
        for key in ("loss", "grad_norm", "lr", "tokens_per_s", "host_mem_gib"):
            if rec["type"] in ("train", "eval") and key in rec:
                want[(f"{rec['type']}/{key}", rec["step"])] = rec[key]
    assert {k for k in want if k[0].startswith("train/loss")} == {("train/loss", s) for s in range(1, 5)}, want.keys()
    assert ("eval/loss", 2) in want and ("eval/loss", 4) in want, want.keys()
    for k, v in want.items():
        assert k in got, f"{k} is in the log but not in the event file"
        assert abs(got[k] - v) <= 1e-6 * max(1.0, abs(v)), f"{k}: event {got[k]}, log {v}"


def test_crc_damage_detected(tmp):
    """A flipped byte in a record fails the reader's CRC check: the checksums are the real ones."""
    try:
        from tensorboard.backend.event_processing import event_file_loader
    except ImportError:
        raise Skip("the tensorboard package is not installed (pip install tensorboard)")
    import struct
    data = b"\x09" + struct.pack("<d", 1.0) + b"\x10\x01"
    path = os.path.join(tmp, "events.out.tfevents.1.x")
    # the record as qt_tb_frame writes it, built here from the format's description
    crc = crc32c(struct.pack("<Q", len(data)))
    rec = struct.pack("<Q", len(data)) + struct.pack("<I", mask(crc)) + data + struct.pack("<I", mask(crc32c(data)))
    open(path, "wb").write(rec)
    assert [e.step for e in event_file_loader.EventFileLoader(path).Load()] == [1]
    bad = bytearray(rec)
    bad[14] ^= 1
    open(path, "wb").write(bytes(bad))
    try:
        n = len(list(event_file_loader.EventFileLoader(path).Load()))
    except Exception:  # noqa: BLE001 — a DataLossError from the reader
        n = 0
    assert n == 0, "a damaged record was read"


def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def mask(c):
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
