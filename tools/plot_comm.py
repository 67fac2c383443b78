#!/usr/bin/env python3
"""plot_comm.py — busbw against size from comm_bench's TSV: one panel per op, one line per strategy,
measured ceilings dashed. Usage: plot_comm.py comm.tsv comm.png [comm.md (gets a link line appended)]."""
import csv
import sys


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    tsv, png = sys.argv[1], sys.argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_comm: matplotlib not installed; no PNG")
        return 0
    rows = [r for r in csv.DictReader(open(tsv), delimiter="\t") if "+" not in r["op"]]
    if not rows:
        print("plot_comm: no rows in", tsv)
        return 0
    ops = [o for o in ("all_gather", "reduce_scatter", "all_reduce", "broadcast") if any(r["op"] == o for r in rows)]
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        sel = [r for r in rows if r["op"] == op]
        ceilings = {}
        multi = len({r["ranks"] for r in sel}) > 1
        for key in dict.fromkeys((r["strategy"], r["ranks"]) for r in sel):
            mine = [r for r in sel if (r["strategy"], r["ranks"]) == key]
            pts = sorted((int(r["bytes"]), float(r["busbw_GBs"])) for r in mine)
            name = f"{key[0]} n={key[1]}" if multi else key[0]
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name,
                            ls="-" if key[1] == sel[0]["ranks"] else ":")
            ce = max(float(r["ceiling_GBs"]) for r in mine)
            if ce > 0:
                ceilings.setdefault(round(ce, 1), line.get_color())
        for ce, color in ceilings.items():
            ax.axhline(ce, ls="--", lw=1, color=color, alpha=0.6)
            ax.text(4096, ce, f" ceiling {ce:.0f}", va="bottom", fontsize=7, color=color)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{op} (bf16), " + "/".join(dict.fromkeys(r["ranks"] for r in sel)) + " ranks")
        ax.set_xlabel("size (bytes, full tensor)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    label = rows[0]["label"]
    fig.suptitle(f"qtrain comm_bench {label}".strip())
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print("plot_comm: wrote", png)
    if len(sys.argv) > 3:
        with open(sys.argv[3], "a") as md:
            md.write(f"\nPlot: `{png.split('/')[-1]}` (python3 tools/plot_comm.py {tsv} {png}).\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
