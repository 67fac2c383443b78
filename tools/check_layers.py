#!/usr/bin/env python3
"""check_layers.py BUILD — `make check-layers`: no #include and no call from a lower floor to a higher one.

Floors, lowest first (a folder may use its own floor and those below):
  0 src/core   1 cuda/, comm/   2 src/io, src/config, src/plan, src/ref   3 src/gpu   4 src/engine   5 src/train
  6 src/api    7 src/python
cuda/ and comm/ know nothing of models or configs: they include only src/core's headers and their own.

Includes: a header of include/ belongs to the floor of the objects that define the functions it declares
(the lowest of them: qt_error.h is src/core's, its CUDA status decoders cuda/'s); a header that declares
no function is a type header of src/core. Every source of a floor and every header is checked.
Calls: each library object's undefined symbols (nm) resolved to the object that defines them.
Prints each violation and exits 1 when there is one; then lists the circles of objects calling each other
within a floor (allowed, reported)."""
import glob
import os
import re
import subprocess
import sys

FLOORS = {"src/core": 0, "cuda": 1, "comm": 1, "src/io": 2, "src/config": 2, "src/plan": 2, "src/ref": 2, "src/gpu": 3,
          "src/engine": 4, "src/train": 5, "src/api": 6, "src/python": 7}
NAMES = {0: "core", 1: "cuda/comm", 2: "io/config/plan/ref", 3: "gpu", 4: "engine", 5: "train", 6: "api", 7: "python"}


def folder(path):
    """The floor folder of a source path (src/python/qtrain/_qtrain.c -> src/python), or None."""
    for f in sorted(FLOORS, key=len, reverse=True):
        if path == f or path.startswith(f + "/"):
            return f
    return None


def sources():
    out = []
    for f in FLOORS:
        for ext in ("c", "cu", "cuh", "h"):
            out += glob.glob(f + "/**/*." + ext, recursive=True)
    return sorted(out)


def object_of(src, build):
    return os.path.join(build, src[:-3] + ".cu.o" if src.endswith(".cu") else src[:-2] + ".o")


def nm(obj, undefined):
    args = ["nm", "-u" if undefined else "--defined-only", obj]
    res = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    syms = set()
    for line in res.splitlines():
        parts = line.split()
        if undefined and len(parts) == 2:
            syms.add(parts[1])
        elif not undefined and len(parts) == 3 and parts[1] in "TDBRVW":
            syms.add(parts[2])
    return syms


def declared(header):
    """Functions a header declares: a qt_ / qtrain_ name before '(' on a line at column 0 (static inline
    bodies and continuation lines are indented; macros and comments are skipped)."""
    text = re.sub(r"/\*.*?\*/", "", open(header).read(), flags=re.S)
    names = set()
    for line in text.splitlines():
        if not line or line[0] in " \t#}":
            continue
        m = re.search(r"\b((?:qt|qtrain)_\w+)\s*\(", line)
        if m and "static inline" not in line:
            names.add(m.group(1))
    return names


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    objs = {}
    # The two build variants (Makefile): the CUDA build has no engine_none.c; the CPU-only build has it and
    # leaves out cuda/, comm/, src/gpu/ and the GPU engines (CPU_ONLY_OUT). Their objects may be missing.
    cpu_only = os.path.exists(object_of("src/engine/engine_none.c", build))
    gpu_only = ("cuda/", "comm/", "src/gpu/", "src/engine/engine_gpu.c", "src/engine/engine_dp.c",
                "src/engine/dp_sync.c", "src/engine/dp_grads.c", "src/engine/dp_fill.c", "src/engine/plan_auto.c", "src/engine/plan_choose.c", "src/engine/dp_nodes",
                "src/plan/plan_axes.c", "src/plan/plan_choice.c", "src/plan/plan_cost.c", "src/plan/plan_lora.c")
    # NCCL or not (NCCL_FOUND): dp_nodes.c and comm/internode.c, or dp_nodes_none.c in their place
    nccl_variants = ("src/engine/dp_nodes.c", "src/engine/dp_nodes_none.c", "comm/internode.c")
    for src in sources():
        if src.endswith((".c", ".cu")) and src != "src/train/main.c":
            o = object_of(src, build)
            if os.path.exists(o):
                objs[src] = o
            elif folder(src) == "src/python" or src == "src/engine/engine_none.c" or src in nccl_variants or \
                    (cpu_only and src.startswith(gpu_only)):
                continue
            else:
                sys.exit("check_layers: %s is not built (run make first)" % o)
    defs = {src: nm(o, False) for src, o in objs.items()}
    definer = {}
    for src, syms in defs.items():
        for s in syms:
            definer.setdefault(s, src)
    bad = []
    # a header's floor and folders
    hfloor, hfolders = {}, {}
    for h in sorted(glob.glob("include/*.h")):
        srcs = {definer[n] for n in declared(h) if n in definer}
        hfolders[os.path.basename(h)] = {folder(s) for s in srcs} or {"src/core"}
        hfloor[os.path.basename(h)] = min(FLOORS[f] for f in hfolders[os.path.basename(h)])
    for f in sources() + sorted(glob.glob("include/*.h")):
        if f.startswith("include/"):
            fl, own = hfloor[os.path.basename(f)], hfolders[os.path.basename(f)]
        else:
            fl, own = FLOORS[folder(f)], {folder(f)}
        for n, line in enumerate(open(f), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m or not os.path.exists("include/" + m.group(1)):
                continue
            inc = m.group(1)
            if hfloor[inc] > fl:
                bad.append("%s:%d: includes %s (%s) from floor %s" % (f, n, inc, NAMES[hfloor[inc]], NAMES[fl]))
            elif own & {"cuda", "comm"} and not hfolders[inc] & ({"src/core"} | own):
                bad.append("%s:%d: includes %s (%s): cuda/ and comm/ include only src/core's headers and their own"
                           % (f, n, inc, "/".join(sorted(hfolders[inc]))))
    # calls
    calls = {}
    for src, o in objs.items():
        for s in sorted(nm(o, True)):
            d = definer.get(s)
            if not d or d == src:
                continue
            calls.setdefault(src, set()).add(d)
            if FLOORS[folder(d)] > FLOORS[folder(src)]:
                bad.append("%s calls %s (%s, floor %s) from floor %s" % (src, s, d, NAMES[FLOORS[folder(d)]],
                                                                         NAMES[FLOORS[folder(src)]]))
    for b in bad:
        print("check-layers: " + b)
    # circles: strongly connected components of the call graph (Tarjan)
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(calls.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(objs):
        if v not in index:
            visit(v)
    for c in comps:
        print("check-layers: circle (same floor, allowed): " + " <-> ".join(c))
    print("check-layers: %d sources, %d objects: %d violation%s, %d circle%s" % (
        len(sources()), len(objs), len(bad), "" if len(bad) == 1 else "s", len(comps), "" if len(comps) == 1 else "s"))
    return 1 if bad else 0


if __name__ == "__main__":
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
