#!/usr/bin/env python3
"""test_python_gpu.py — the Python binding on a GPU (skipped without one, saying why): the CPU tests'
equalities (Trainer.step() == the qtrain program byte for byte, fed batches == the loader's, loss
masks == a masked shard, a mask of ones changes nothing, parameters round trip) in bf16 and in fp8,
and the overhead of a Python step against the CLI's step time at 0.5B (printed as a RESULT line).
`tools/gpu-check.sh python` runs it: PYTHONPATH=build/python python3 tests/test_python_gpu.py."""
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_python as base  # noqa: E402
from qt_test import BUILD, ROOT, Skip, run_pytest  # noqa: E402

PRECISION = {
    "bf16": "precision:\n  model_dtype: bf16\n  matmul_dtype: bf16\n  grad_dtype: bf16\n",
    "fp8": "precision:\n  model_dtype: bf16\n  matmul_dtype: e4m3\n  grad_dtype: e4m3\n  persistent_quants: true\n",
}


def gpu(precision):
    """Points test_python's configs at the GPU in this precision, or skips when there is no GPU."""
    qtrain, np = base.need()
    probe = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"qt_gpu_probe_{os.getpid()}")
    os.makedirs(probe, exist_ok=True)
    base.ENGINE.update(device="cuda", hidden=128, inter=384, extra=PRECISION[precision])
    try:
        qtrain.Trainer(base.setup_run(probe), {"log.file": ""}, export_only=True).close()
    except qtrain.DeviceError as e:
        base.ENGINE.update(device="cpu", hidden=64, inter=128, extra="")
        raise Skip(f"no usable CUDA device ({str(e)[:120]})")
    finally:
        shutil.rmtree(probe, ignore_errors=True)


ONE = {}  # name -> the test's body, run in a process of its own


def make(name, fn, precision):
    def one(tmp):
        gpu(precision)
        # the CLI's and the Trainer's runs multiply with the same autotuned algorithms: the picks file of this
        # test alone (the default one in ~/.cache is shared with whatever else runs on the GPU meanwhile)
        base.ENGINE["extra"] += f"perf:\n  tuning_cache: {tmp}/matmul-picks.bin\n"
        try:
            fn(tmp)
        finally:
            base.ENGINE.update(device="cpu", hidden=64, inter=128, extra="")

    def test(tmp):
        # in a process of its own, as a user's run is: the autotuned picks are the process's, and a checkpoint
        # keeps them all (another test's Trainer in the same process would add its picks to this one's files)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name, tmp], capture_output=True,
                           text=True, timeout=1800)
        if r.returncode == 77:
            raise Skip(r.stdout.strip().splitlines()[-1])
        assert r.returncode == 0, f"{name}: exit {r.returncode}\n{(r.stdout + r.stderr)[-3000:]}"
    ONE[name] = one
    test.__name__ = name
    test.__doc__ = f"{fn.__doc__} ({precision} on the GPU)"
    return test


for _p in ("bf16", "fp8"):
    for _fn in (base.test_cli_identical, base.test_fed_batches_equal_loader, base.test_mask_half_matches_masked_shard,
                base.test_mask_ones_changes_nothing, base.test_parameters_round_trip, base.test_resume):
        _n = f"test_gpu_{_p}_{_fn.__name__[5:]}"
        globals()[_n] = make(_n, _fn, _p)
_n = "test_gpu_bf16_lora_equals_cli"  # LoRA's GPU backward is bf16 (an fp8 one is refused)
globals()[_n] = make(_n, base.test_lora_equals_cli, "bf16")


def test_gpu_dlpack_gradients(tmp):
    """gradients(device=True): torch.from_dlpack reads the GPU gradients without a copy (its data_ptr is
    the trainer's address) and they equal the host copies bit for bit; the capsules keep the trainer
    object alive."""
    qtrain, np = base.need()
    gpu("bf16")
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed")
    try:
        with qtrain.Trainer(base.setup_run(tmp), {"log.file": ""}) as tr:
            tr.backward()
            host = tr.gradients()
            caps = tr.gradients(device=True)
            for name in ("model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"):
                t = torch.from_dlpack(caps[name])
                assert t.is_cuda and t.dtype == torch.float32 and tuple(t.shape) == host[name].shape
                assert t.data_ptr() == tr._grad_device_ptr(name), "torch copied the gradients"
                assert torch.equal(t.cpu(), torch.from_numpy(host[name])), f"{name}: device != host copy"
            tr.update()
            try:  # a live view is memory of the trainer: close() refuses and the trainer stays open
                tr.close()
                raise AssertionError("close() ran while DLPack gradient views were alive")
            except RuntimeError as e:
                assert "DLPack gradient view" in str(e) and not tr.closed, e
            del t, caps  # the views die; the with block's close() then runs
    finally:
        base.ENGINE.update(device="cpu", hidden=64, inter=128, extra="")


def shard_u32(path, tokens, vocab):
    payload = tokens.astype("<u4").tobytes()
    head = b"QTTOKENS" + struct.pack("<IIQIIQ", 2, 4, len(tokens), vocab, 0, zlib.crc32(payload))
    with open(path, "wb") as f:
        f.write(head + bytes(64 - len(head)) + payload)


def test_overhead_0_5b(tmp):
    """Median step time of Trainer.step() (loader batches, and batches fed from numpy) against the
    qtrain program's on configs/qwen2.5-0.5b-bf16.yaml (one micro-batch of 16 x 1024 a step, after 3
    warm-up steps). Prints RESULT {"python_overhead_pct": ...}; fails above 1%."""
    qtrain, np = base.need()
    gpu("bf16")
    base.ENGINE.update(device="cpu", hidden=64, inter=128, extra="")
    steps, warm = 13, 3
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 151936, 16 * 1024 * (steps + 2) + 1, dtype=np.int64)
    shard_u32(os.path.join(tmp, "train.bin"), toks, 151936)
    sets = {"data.train": f"{tmp}/train.bin", "data.eval": "", "data.micro_batch": 16, "data.grad_accum": 1,
            "parallel.gpus": 1, "optim.steps": steps, "optim.warmup": 2, "log.every": 1, "checkpoint.every": 0,
            "checkpoint.dir": f"{tmp}/cli", "log.file": f"{tmp}/cli.jsonl", "export.dir": f"{tmp}/cli_export"}
    cfg = os.path.join(ROOT, "configs", "qwen2.5-0.5b-bf16.yaml")
    args = [os.path.join(BUILD, "qtrain"), cfg]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    tok_step = 16 * 1024
    cli = [tok_step / rec["tokens_per_s"] for rec in map(json.loads, open(f"{tmp}/cli.jsonl"))
           if rec["type"] == "train" and rec["step"] > warm]
    py = {}
    for mode in ("loader", "fed"):
        ov = dict(sets, **{"checkpoint.dir": f"{tmp}/{mode}", "log.file": f"{tmp}/{mode}.jsonl"})
        with qtrain.Trainer(cfg, ov) as tr:
            batches = [tr.next_batch()[0] for _ in range(steps)] if mode == "fed" else None
            if mode == "fed":  # the same data again, from numpy this time
                tr.close()
                tr = qtrain.Trainer(cfg, dict(ov, **{"checkpoint.dir": f"{tmp}/fed2", "log.file": f"{tmp}/fed2.jsonl"}))
            times = []
            for s in range(steps - 1):  # the last step writes the final checkpoint
                t0 = time.perf_counter()
                tr.step(batches[s]) if batches else tr.step()
                times.append(time.perf_counter() - t0)
            tr.close()
        py[mode] = statistics.median(times[warm:])
    c = statistics.median(cli[:steps - 1 - warm])
    pct = {m: 100 * (t - c) / c for m, t in py.items()}
    print(f"RESULT {json.dumps({'cli_step_s': round(c, 5), 'python_step_s': round(py['loader'], 5), 'python_fed_step_s': round(py['fed'], 5), 'python_overhead_pct': round(pct['loader'], 3), 'python_fed_overhead_pct': round(pct['fed'], 3)})}")
    assert pct["loader"] < 1.0, f"a Python step takes {pct['loader']:.2f}% longer than the CLI's"


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--one":  # one test's body (make's test runs it so)
        try:
            ONE[sys.argv[2]](sys.argv[3])
        except Skip as e:
            print(e)
            sys.exit(77)
        sys.exit(0)
    sys.exit(run_pytest(os.path.abspath(__file__), globals()))
