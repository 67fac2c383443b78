#!/usr/bin/env python3
"""test_plot.py — tools/plot on two runs: each run keeps one colour for its train line, its eval points
and its lr, grad-norm and tokens/s panels (which show the logged values); a config first line, unknown
records and a line cut short by a kill are skipped. Inspects the matplotlib figure, not pixels."""
import importlib.machinery
import importlib.util
import json
import os
import sys

from qt_test import ROOT, Skip, run_tests


def write_log(path, seed):
    recs = [{"config": {"model": {"hidden_size": 64}}, "qtrain": "0.1.0"}]   # a header line: no step
    for step in range(10, 101, 10):
        recs.append({"type": "train", "step": step, "loss": 5.0 - step / 50 - seed, "grad_norm": 1.0 + step / 100,
                     "lr": 1e-3 * step / 100, "tokens_per_s": 1000.0 * (seed + 1) + step, "timestamp": 1.7e9 + step,
                     "elapsed_s": step * 0.1, "tokens": step * 1024})
        if step % 50 == 0:
            recs.append({"type": "eval", "step": step, "loss": 4.9 - step / 50 - seed})
    recs.append({"type": "checkpoint", "step": 100, "path": "x"})                 # a record plot does not know
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(r) for r in recs) + '\n{"type":"train","step":110,"lo')  # cut by a kill
    return recs


def plot_figure(argv):
    """Runs tools/plot's main() in this process and returns the figure it saves."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise Skip("matplotlib not installed")
    loader = importlib.machinery.SourceFileLoader("qt_plot", os.path.join(ROOT, "tools", "plot"))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("qt_plot", loader))
    loader.exec_module(mod)
    saved, real = [], Figure.savefig
    Figure.savefig = lambda self, *a, **k: saved.append(self)
    old_argv, sys.argv = sys.argv, ["plot", *argv]
    try:
        mod.main()
    except SystemExit as e:
        raise AssertionError(f"plot exited: {e.code}") from None
    finally:
        Figure.savefig, sys.argv = real, old_argv
    assert len(saved) == 1, f"{len(saved)} figures saved"
    return saved[0]


def test_colours_and_panels(tmp):
    from matplotlib.colors import to_rgba
    logs = [os.path.join(tmp, f"run{i}.jsonl") for i in range(2)]
    recs = [write_log(p, i) for i, p in enumerate(logs)]
    fig = plot_figure([*logs, "-o", os.path.join(tmp, "c.png"), "--labels", "bf16,fp8"])
    lines = {ln.get_label(): ln for ax in fig.axes for ln in ax.get_lines()}
    colour = {}
    for label in ("bf16", "fp8"):
        tr, ev = lines.get(f"{label} train"), lines.get(f"{label} eval")
        assert tr and ev, f"no train/eval lines for {label}: {sorted(lines)}"
        assert to_rgba(tr.get_color()) == to_rgba(ev.get_color()), \
            f"{label}: train line {tr.get_color()}, eval points {ev.get_color()}"
        colour[label] = to_rgba(tr.get_color())
    assert colour["bf16"] != colour["fp8"], "both runs have one colour"
    for key, pattern in (("lr", "lr"), ("grad_norm", "grad"), ("tokens_per_s", "tokens/s")):
        axs = [ax for ax in fig.axes if pattern in ax.get_ylabel().lower()]
        assert len(axs) == 1, f"{len(axs)} panels with a y label containing {pattern!r}: " \
            f"{[ax.get_ylabel() for ax in fig.axes]}"
        got = axs[0].get_lines()
        assert len(got) == 2, f"{pattern} panel: {len(got)} lines, expected one per run"
        for ln, label, rs in zip(got, ("bf16", "fp8"), recs):
            assert to_rgba(ln.get_color()) == colour[label], f"{pattern} panel: {label} in another colour"
            want = [r[key] for r in rs if r.get("type") == "train"]
            assert list(ln.get_ydata()) == want, f"{pattern} panel, {label}: {list(ln.get_ydata())} != {want}"


def test_no_records(tmp):
    path = os.path.join(tmp, "empty.jsonl")
    open(path, "w").write('{"config": {}}\n')
    try:
        plot_figure([path, "-o", os.path.join(tmp, "c.png")])
    except AssertionError as e:
        assert "no train or eval records" in str(e), e
    else:
        raise AssertionError("a log without records plotted")


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
