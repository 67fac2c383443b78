#!/usr/bin/env python3
"""mode_flags.py [--list] [--max N] [--exclude PATH]... — counts the code lines that read a memory-mode flag
outside the plan (src/plan/), the config's key table (src/config/config_keys.c: the names of the values), the
config loader (src/config/config.c: it maps the older spellings memory.offload_optimizer, memory.offload_residual
and parallel.shard_optimizer onto memory.offload and parallel.zero, and places an error at the key to blame; the
cross-mode rules and defaults it applies live in src/plan/plan_rules.c) and the placement implementations
(src/gpu/place_*.c: PLACEMENTS below, and each --exclude: a path, a folder or a glob).

A memory-mode flag is what decides where an item lives or how it is rebuilt: the ZeRO level and data-parallel
mode, the offloaded items, the host / weight-slot / e4m3-code placements, zero-copy, recompute and the fp8
weight cache. It is read as
  - a plan part's member: weights.{host, host_one, host_shard, slots, e4m3, ahead}, grads.{sharded, host,
    host_one, host_shard, embed_apart}, optimizer.{host, mask, zero_copy, ahead}, acts.{recompute,
    offload_residual}, precision.fp8_cache, parallel.{zero, dp};
  - a member of that name elsewhere (the config, an engine, a store): ->/. zero, sharded, shard_optimizer,
    offload, offload_optimizer, offload_residual, zero_copy, recompute, fp8_weight_cache, opt_host;
  - a value: QT_OFF_*, QT_RC_*, QT_FP8_WCACHE_*, QT_DP_*;
in the C/CUDA sources and headers of src/, cuda/, comm/ and include/ (comments and strings left out). A line
counts once however many flags it reads; a line that only assigns a flag or defines a value does not count.
Prints the total and the count per file (--list: every line); exits 1 when --max N is given and the total is
over N."""
import fnmatch
import glob
import re
import sys

DIRS = ("src", "cuda", "comm", "include")
EXTS = ("c", "h", "cu", "cuh")
PLAN = ("src/plan/", "src/config/config_keys.c", "src/config/config.c")
# Files implementing a placement (one per weights / gradients / optimizer-state strategy, named
# src/gpu/place_<item>_<placement>.c, e.g. place_weights_host.c): they are where the modes are meant to be read.
PLACEMENTS = ("src/gpu/place_*.c",)

PARTS = {
    "weights": "host|host_one|host_shard|slots|e4m3|ahead",
    "grads": "sharded|host|host_one|host_shard|embed_apart",
    "optimizer": "host|mask|zero_copy|ahead",
    "acts": "recompute|offload_residual",
    "precision": "fp8_cache",
    "parallel": "zero|dp",
}
MEMBERS = "zero|sharded|shard_optimizer|offload|offload_optimizer|offload_residual|zero_copy|recompute|" \
          "fp8_weight_cache|opt_host"
FLAG = re.compile(r"\b(?:" + "|".join(rf"{p}\.(?:{m})" for p, m in PARTS.items()) + r")\b"
                  + rf"|(?:->|\.)\s*(?:{MEMBERS})\b"
                  + r"|\bQT_(?:OFF|RC|FP8_WCACHE|DP)_\w+")
ASSIGNED = re.compile(r"\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)")  # after a flag: it is the target of an assignment
ENUMERATOR = re.compile(r"\s*QT_\w+\s*(?:=(?!=)|,|$)")  # a line defining a value (an enum's member)


def code_lines(path):
    """(number, text) of each line with comments, strings and preprocessor directives blanked."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    text = open(path, encoding="utf-8", errors="replace").read()
    text = re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, text, flags=re.S)
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", blank, text, flags=re.M)
    return enumerate(text.split("\n"), 1)


def reads_flag(line):
    if ENUMERATOR.match(line):
        return False
    return any(not ASSIGNED.match(line, m.end()) for m in FLAG.finditer(line))


def main():
    args = sys.argv[1:]
    show, limit, exclude = False, None, list(PLAN) + list(PLACEMENTS)
    while args:
        a = args.pop(0)
        if a == "--list":
            show = True
        elif a == "--max":
            limit = int(args.pop(0))
        elif a == "--exclude":
            exclude.append(args.pop(0))
        else:
            sys.exit(__doc__)
    per_file, total = {}, 0
    for d in DIRS:
        for ext in EXTS:
            for path in sorted(glob.glob(d + "/**/*." + ext, recursive=True)):
                if any(path == e or path.startswith(e.rstrip("/") + "/") or fnmatch.fnmatch(path, e) for e in exclude):
                    continue
                src = None
                for n, line in code_lines(path):
                    if reads_flag(line):
                        per_file[path] = per_file.get(path, 0) + 1
                        total += 1
                        if show:
                            src = src or open(path, encoding="utf-8", errors="replace").read().split("\n")
                            print(f"{path}:{n}: {src[n - 1].strip()}")
    for path, n in sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n:5d}  {path}")
    print(f"mode_flags: {total} lines read a memory-mode flag outside {', '.join(exclude)}"
          + (f" (at most {limit})" if limit is not None else ""))
    return 1 if limit is not None and total > limit else 0


if __name__ == "__main__":
    sys.exit(main())
