#!/usr/bin/env python3
"""test_python_inputs.py — what the Python binding refuses and what it calls back: tokens and masks that
a cast would change (refused, naming the first bad index), NaN/Inf weights to set or to export
(refused, naming the tensor), Trainer.resume(dir) past a damaged newest checkpoint without a config as
with one, and the on_step callbacks. CPU engine. `BUILD=build python3 tests/test_python_inputs.py`."""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qt_test import run_pytest  # noqa: E402
from test_python import need, setup_run  # noqa: E402


def test_unsafe_casts_refused(tmp):
    """Tokens and masks that a cast to int32/uint8 would change are refused, naming the first bad
    index and its value: int64 2**32 + 5 (would train as 5), uint32 2**31, negative ids, float arrays
    (would truncate), a mask of 256 (would become 0), of 0.5, of 2 or -1; nothing is stepped. Python
    lists of in-range ints, bool masks and uint16 tokens are fine."""
    qtrain, np = need()
    cfg = setup_run(tmp)
    with qtrain.Trainer(cfg, {"log.file": "", "eval.every": 0, "checkpoint.every": 0}) as tr:
        rows, T = tr.info()["rows"], tr.info()["seq_len"]
        ok = np.random.default_rng(2).integers(0, 256, (rows, T + 1))
        cases = []
        for dtype, v in ((np.int64, 2 ** 32 + 5), (np.uint32, 2 ** 31), (np.int64, -3), (np.uint64, 2 ** 63)):
            t = ok.astype(dtype)
            t[2, 7] = v
            cases.append(("tokens", t, None, f"tokens[2][7] = {v}", "[0, 256)"))
        cases.append(("tokens", ok.astype(np.float32) + 0.5, None, "float32", "integer"))
        cases.append(("tokens", ok.astype(np.float64), None, "float64", "integer"))
        for dtype, v in ((np.int64, 256), (np.int32, 2), (np.int8, -1)):
            m = np.ones((rows, T + 1), dtype)
            m[3, 1] = v
            cases.append(("mask", ok, m, f"mask[3][1] = {v}", "0 or 1"))
        m = np.ones((rows, T + 1))
        m[0, 4] = 0.5
        cases.append(("mask", ok, m, "float64", "0 or 1"))
        for what, t, m, named, expected in cases:
            try:
                tr.step(t, m)
                raise AssertionError(f"{what}: {named} was accepted")
            except qtrain.ArgumentError as e:
                assert named in str(e) and expected in str(e), f"{named}: {e}"
            try:
                tr.eval(t, m)
                raise AssertionError(f"eval: {what}: {named} was accepted")
            except qtrain.ArgumentError as e:
                assert named in str(e), str(e)
        assert tr.info()["step"] == 0, "a refused batch was stepped"
        a = tr.step(ok.tolist(), np.ones((rows, T + 1), bool))["loss"]
    with qtrain.Trainer(cfg, {"log.file": "", "eval.every": 0, "checkpoint.every": 0, "checkpoint.dir": f"{tmp}/b"}) as tr:
        assert tr.step(ok.astype(np.uint16))["loss"] == a, "the same tokens in another dtype trained differently"


def test_set_parameter_nonfinite(tmp):
    """set_parameter with a NaN/Inf raises ArgumentError naming the tensor and element and changes
    nothing (a NaN set and saved would surface later as "training diverged")."""
    qtrain, np = need()
    cfg = setup_run(tmp)
    with qtrain.Trainer(cfg, {"log.file": "", "eval.every": 0, "checkpoint.every": 0}) as tr:
        name = "model.layers.0.mlp.up_proj.weight"
        before = tr.get_parameter(name)
        for v in (np.nan, np.inf, -np.inf):
            w = before.copy()
            w[3, 5] = v
            try:
                tr.set_parameter(name, w)
                raise AssertionError(f"set_parameter accepted {v}")
            except qtrain.ArgumentError as e:
                assert f"{name}[{3 * w.shape[1] + 5}]" in str(e) and "finite" in str(e), str(e)
            assert (tr.get_parameter(name) == before).all(), "a refused set_parameter changed the weights"


def test_export_nonfinite(tmp):
    """export of weights holding a NaN/Inf (a diverged run) raises DivergedError naming the tensor and
    writes nothing (qtrain's own import would refuse the file)."""
    qtrain, np = need()
    cfg = setup_run(tmp)
    with qtrain.Trainer(cfg, {"log.file": "", "eval.every": 0, "checkpoint.every": 0}) as tr:
        tr.set_lr(3e38)  # AdamW's first update is about lr in size: the weights overflow
        for _ in range(3):
            try:
                tr.step()
            except qtrain.DivergedError:
                break
        else:
            raise AssertionError("lr 3e38 did not diverge")
        out = os.path.join(tmp, "hf")
        try:
            tr.export(out, dtype="fp32")
            raise AssertionError("non-finite weights were exported")
        except qtrain.DivergedError as e:
            assert "model." in str(e) and "NaN/Inf" in str(e) and out in str(e), str(e)
        assert not os.path.exists(os.path.join(out, "model.safetensors")), "an export was written"


def test_resume_dir_falls_back_without_config(tmp):
    """Trainer.resume(dir) skips a damaged newest checkpoint (moved aside to .bad) and resumes the one
    before it, with the checkpoint's config as with a given config: both paths end at the same step with
    the same weights."""
    qtrain, np = need()
    cfg = setup_run(tmp)
    with qtrain.Trainer(cfg, {"log.file": "", "eval.every": 0, "checkpoint.every": 3}) as tr:
        for _ in range(6):
            tr.step()
    ck = os.path.join(tmp, "ckpt")
    newest = os.path.join(ck, "ckpt_00000006.qtc")
    data = bytearray(open(newest, "rb").read())
    data[len(data) // 2] ^= 0x40
    got = {}
    for how in ("own config", "given config"):
        d = os.path.join(tmp, how.replace(" ", "_"))
        shutil.copytree(ck, d)
        open(os.path.join(d, "ckpt_00000006.qtc"), "wb").write(data)
        config = None if how == "own config" else cfg
        with qtrain.Trainer.resume(d, config, {"checkpoint.dir": d, "log.file": ""}) as tr:
            got[how] = (tr.info()["step"], tr.parameters())
        assert os.path.exists(os.path.join(d, "ckpt_00000006.qtc.bad")), f"{how}: the damaged checkpoint stays"
    assert got["own config"][0] == got["given config"][0] == 3, {k: v[0] for k, v in got.items()}
    assert all((got["own config"][1][k] == got["given config"][1][k]).all() for k in got["own config"][1])


def test_on_step_callbacks(tmp):
    """on_step callbacks see every optimizer step's metrics (step(), update(); eval_loss when evaluated),
    in order, each its own copy; on_step is a mutable list; a callback's exception comes out of step()
    after the step is done; resume() takes them too."""
    qtrain, np = need()
    cfg = setup_run(tmp)
    seen, order = [], []

    def first(m):
        order.append("first")
        seen.append(dict(m))
        m["loss"] = -1.0  # its own copy: the next callback and step()'s result keep the loss

    def second(m):
        order.append("second")
        assert m["loss"] != -1.0

    with qtrain.Trainer(cfg, {"log.file": "", "checkpoint.every": 0}, on_step=[first, second]) as tr:
        outs = [tr.step() for _ in range(5)]
        tr.backward()
        assert len(seen) == 5, "backward() alone called on_step"
        outs.append(tr.update())
        assert [m["step"] for m in seen] == [1, 2, 3, 4, 5, 6] and order == ["first", "second"] * 6
        assert all(set(m) >= {"step", "loss", "lr", "grad_norm", "tokens_per_s", "saved"} for m in seen)
        assert [("eval_loss" in m) for m in seen] == [False] * 4 + [True, False], "eval.every is 5"
        assert [o["loss"] for o in outs] == [m["loss"] for m in seen] and all(o["loss"] > 0 for o in outs)
        tr.on_step.remove(second)

        def boom(m):
            raise KeyError(f"stop at {m['step']}")
        tr.on_step.append(boom)
        try:
            tr.step()
            raise AssertionError("the callback's exception was swallowed")
        except KeyError as e:
            assert "stop at 7" in str(e)
        assert tr.info()["step"] == 7 and seen[-1]["step"] == 7
        tr.on_step.clear()
        tr.step()
        assert len(seen) == 7
        path = tr.save()
    try:
        qtrain.Trainer(cfg, on_step=[first, 3])
        raise AssertionError("a non-callable on_step was accepted")
    except TypeError as e:
        assert "on_step" in str(e)
    with qtrain.Trainer.resume(path, on_step=first) as tr:
        tr.step()
    assert seen[-1]["step"] == 9


if __name__ == "__main__":
    sys.exit(run_pytest(os.path.abspath(__file__), globals()))
