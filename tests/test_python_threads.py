#!/usr/bin/env python3
"""test_python_threads.py — the Python binding under threads: close() from another thread during each
call that releases the GIL (export, next_batch, parameters, gradients, set_parameter, the DLPack call,
step) waits for the call and never crashes; two calls at once on one trainer get RuntimeError naming
the call in progress; a callback's call on its own trainer raises instead of deadlocking; DLPack views
(one GPU) keep close() from freeing their memory. Each race runs many times in a child process, so a
crash is a failure of the test, not of the run. `BUILD=build python3 tests/test_python_threads.py`."""
import json
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_python as base  # noqa: E402
from qt_test import BUILD, Skip, run_pytest  # noqa: E402

# The child: for each of n rounds, a fresh trainer; thread A runs op in a loop, thread B closes the
# trainer at a random instant inside one of A's calls. Prints a JSON summary: what each side got.
RACE = r"""
import json, os, random, sys, threading, time
import numpy as np
import qtrain
cfg, op, n, tmp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rnd = random.Random(int(sys.argv[5]))
out = {"a": {}, "close": {}, "after_close_ok": 0}

def note(side, what):
    out[side][what] = out[side].get(what, 0) + 1

def kind(e):
    return f"{type(e).__name__}: {str(e).split(':')[0] if 'closed' in str(e) else str(e)[:60]}"

for r in range(n):
    tr = qtrain.Trainer(cfg, {"log.file": "", "eval.every": 0, "checkpoint.every": 0, "checkpoint.dir": f"{tmp}/c{r}"})
    name, shape, _ = tr.tensors()[0]
    w = np.full(shape, 0.01, np.float32)
    calls = {"export": lambda: tr.export(f"{tmp}/hf{r}", dtype="fp32"), "next_batch": tr.next_batch,
             "parameters": tr.parameters, "gradients": tr.gradients, "set_parameter": lambda: tr.set_parameter(name, w),
             "grad_dlpack": lambda: tr.gradients(device=True), "step": tr.step}
    started, held = threading.Event(), []

    def a():
        while True:
            started.set()
            try:
                got = calls[op]()
                if isinstance(got, dict) and op in ("parameters", "gradients"):
                    held.append(got)
                note("a", "ok")
            except ValueError as e:
                if "closed" in str(e):
                    note("a", "closed")
                    return
                note("a", kind(e))
            except Exception as e:
                note("a", kind(e))
                if "closed" in str(e):
                    return

    th = threading.Thread(target=a)
    th.start()
    started.wait()
    time.sleep(rnd.random() * 0.02)
    try:
        tr.close()
        note("close", "ok")
    except Exception as e:
        note("close", kind(e))
        tr.close()
    th.join()
    # host arrays handed out before the close are copies: still readable after it
    out["after_close_ok"] += all(np.isfinite(v).all() for d in held for v in d.values())
print(json.dumps(out))
"""


def run_race(tmp, op, rounds=25, seed=1):
    """The RACE child for op: (exit status, summary dict or None, output tail)."""
    base.need()
    cfg = base.setup_run(tmp)
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    r = subprocess.run([sys.executable, "-c", RACE, cfg, op, str(rounds), tmp, str(seed)], capture_output=True,
                       text=True, timeout=120, env=env)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    summary = json.loads(last) if r.returncode == 0 and last.startswith("{") else None
    return r.returncode, summary, (r.stdout + r.stderr)[-1500:]


def check_race(tmp, op, allowed=()):
    """close() during op, 25 rounds: no crash, close() always succeeds (it waits), and op only ever
    succeeds, sees the trainer closed, or raises one of allowed (prefixes of 'Type: message')."""
    rc, s, tail = run_race(tmp, op)
    assert rc == 0 and s is not None, f"{op}: the child died (status {rc}; -11 is a segfault):\n{tail}"
    assert s["close"] == {"ok": 25}, f"{op}: close() during the call: {s['close']}"
    odd = {k: v for k, v in s["a"].items() if k not in ("ok", "closed") and not k.startswith(tuple(allowed))}
    assert not odd, f"{op}: the racing call raised {odd}"
    assert s["a"].get("closed") == 25, f"{op}: the loop did not end on a closed trainer: {s['a']}"


def test_close_during_export(tmp):
    check_race(tmp, "export")


def test_close_during_next_batch(tmp):
    check_race(tmp, "next_batch")


def test_close_during_parameters(tmp):
    check_race(tmp, "parameters")


def test_close_during_gradients(tmp):
    check_race(tmp, "gradients")


def test_close_during_set_parameter(tmp):
    check_race(tmp, "set_parameter")


def test_close_during_dlpack(tmp):
    """The DLPack call: on the CPU engine it raises ArgumentError (one GPU only) each time."""
    check_race(tmp, "grad_dlpack", allowed=("ArgumentError",))


def test_close_during_step(tmp):
    check_race(tmp, "step")


def test_close_not_starved(tmp):
    """close() while another thread calls the trainer in a tight loop (step() past optim.steps: a short
    call that releases the GIL and raises ArgumentError) ends that loop after the call in flight: the
    loop's next call sees the trainer closed; close() does not wait for the loop to give up (20,000
    calls)."""
    qtrain, np = base.need()
    cfg = base.setup_run(tmp)
    tr = qtrain.Trainer(cfg, {"log.file": "", "eval.every": 0, "checkpoint.every": 0, "optim.steps": 3})
    for _ in range(3):
        tr.step()
    calls, started, ended = [0], threading.Event(), []

    def loop():
        while calls[0] < 20000:
            try:
                tr.step()
            except qtrain.ArgumentError:
                pass
            except Exception as e:  # noqa: BLE001 — what ended the loop is the test's subject
                ended.append(e)
                return
            calls[0] += 1
            started.set()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    started.wait()
    tr.close()
    at_close = calls[0]
    th.join(120)
    assert at_close < 20000, "close() waited until the loop gave up"
    assert ended and isinstance(ended[0], ValueError) and "closed" in str(ended[0]), ended
    assert calls[0] <= at_close + 1, f"{calls[0] - at_close} calls after close() returned"


def test_two_calls_at_once(tmp):
    """step() in one thread while export() runs in another (and the reverse) is refused with
    RuntimeError naming the call in progress; nothing else goes wrong, and the trainer goes on."""
    qtrain, np = base.need()
    cfg = base.setup_run(tmp)
    with qtrain.Trainer(cfg, {"log.file": "", "eval.every": 0, "checkpoint.every": 0, "optim.steps": 100000}) as tr:
        errors = {"export": [], "step": []}
        stop = threading.Event()

        def exporter():
            for i in range(60):
                try:
                    tr.export(os.path.join(tmp, f"hf{i % 2}"), dtype="fp32")
                except RuntimeError as e:
                    errors["export"].append(str(e))
            stop.set()

        th = threading.Thread(target=exporter)
        th.start()
        while not stop.is_set():
            try:
                tr.step()
            except RuntimeError as e:
                errors["step"].append(str(e))
        th.join()
        during_export = [e for e in errors["step"] if "busy in export()" in e]
        assert during_export, f"no step() was refused while export() ran: {errors['step'][:3]}"
        assert during_export[0].startswith("step(): the trainer is busy in export()"), during_export[0]
        others = [e for k in errors for e in errors[k] if "the trainer is busy in" not in e]
        assert not others, others[:3]
        assert tr.step()["step"] == tr.info()["step"]


def test_call_from_callback(tmp):
    """A log callback calling its own trainer gets RuntimeError naming step() (and close() from it raises
    rather than waiting for itself); the step completes and the callback's error comes out of step()."""
    qtrain, np = base.need()
    cfg = base.setup_run(tmp)
    with qtrain.Trainer(cfg, {"eval.every": 0, "checkpoint.every": 0}) as tr:
        for call in (tr.info, tr.close):
            tr.set_log_callback(lambda rec, call=call: call())
            try:
                tr.step()
                raise AssertionError(f"{call.__name__}() from the callback ran inside step()")
            except RuntimeError as e:
                assert "step()" in str(e) and "callback" in str(e), str(e)
        tr.set_log_callback(None)
        assert not tr.closed and tr.info()["step"] == 2


def test_dlpack_views_survive_close(tmp):
    """One GPU: close() while DLPack gradient views are alive raises and leaves the trainer open (the
    views' memory is the trainer's); once they are gone close() works (skipped without a GPU/torch)."""
    qtrain, np = base.need()
    try:
        import torch
    except ImportError:
        raise Skip("needs torch")
    probe = os.path.join(tmp, "probe")
    os.makedirs(probe)
    base.ENGINE.update(device="cuda", hidden=128, inter=384, extra="")
    try:
        try:
            qtrain.Trainer(base.setup_run(probe), {"log.file": ""}, export_only=True).close()
        except qtrain.DeviceError as e:
            raise Skip(f"no usable CUDA device ({str(e)[:120]})")
        cfg = base.setup_run(tmp)
    finally:
        base.ENGINE.update(device="cpu", hidden=64, inter=128, extra="")
    tr = qtrain.Trainer(cfg, {"log.file": "", "eval.every": 0, "checkpoint.every": 0})
    tr.backward()
    views = {k: torch.from_dlpack(c) for k, c in tr.gradients(device=True).items()}
    want = {k: v.cpu().clone() for k, v in views.items()}
    try:
        tr.close()
        raise AssertionError("close() freed the memory of live DLPack views")
    except RuntimeError as e:
        assert "DLPack" in str(e), str(e)
    assert not tr.closed
    assert all(torch.equal(views[k].cpu(), want[k]) for k in views), "a view's memory changed"
    tr.update()
    del views
    tr.close()
    assert tr.closed


if __name__ == "__main__":
    sys.exit(run_pytest(os.path.abspath(__file__), globals()))
