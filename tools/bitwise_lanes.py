#!/usr/bin/env python3
"""bitwise_lanes.py --shape SHAPE [--lanes N] [--budget S] [--log DIR] [--only REGEX] [--list] — the memory
features' bitwise suites at one of qt_test_data.h's attention shapes, one case per process, N processes at
once on the visible GPU(s) (tools/gpu-check.sh memory runs it per MEMORY_SHAPES entry).

A case is one row of a table-driven test, picked by QT_TEST_CASES: test_zero's ZeRO-3 = ZeRO-2 and ZeRO-2 =
ZeRO-1 tables (each case on 2 and 3 ranks sharing the GPU) and its accumulation test, test_offload's
weights, gradients and optimizer-parts tables and the resume from offloaded [m, v], test_recompute's bf16
and fp8 parts. The names are read from the tests' tables in tests/*.c, so a new row runs without an edit
here. Each case's output goes to DIR/<shape>_<test>_<case>.log; one line per case is printed (PASS, FAIL with
the test's message, SKIP with the test's reason, TIMEOUT when the budget ended it, NOT RUN when the budget was
spent before it started); the exit status is 1 unless every case passed. Run from the repository root after `make`."""
import argparse
import concurrent.futures as cf
import os
import re
import subprocess
import sys
import time

# (binary, QT_TEST_ONLY, the function whose table names the cases, the call that ends the table); a None
# function: one process for the whole test part.
SUITES = [
    ("test_zero", "zero3_equals_zero2", "test_zero3_equals_zero2", "compare_cases("),
    ("test_zero", "zero2_equals_zero1", "test_zero2_equals_zero1", "compare_cases("),
    ("test_zero", "zero2_accumulation", None, None),
    ("test_offload", "weights_bitwise", "test_offload_weights_bitwise", "qt_t_case_selected"),
    ("test_offload", "gradients_bitwise", "test_offload_gradients_bitwise", "qt_t_case_selected"),
    ("test_offload", "opt_parts_bitwise", "test_offload_opt_parts_bitwise", "qt_t_case_selected"),
    ("test_recompute", "recompute_bf16", None, None),
    ("test_recompute", "recompute_fp8", None, None),
]
EXTRA = {"opt_parts_bitwise": ["o_resume"]}  # cases a test selects outside its table


def table(binary, fn, stop):
    src = open(f"tests/{binary}.c").read()
    a = src.index(f"static void {fn}(")
    return re.findall(r'^\s*\{"([a-z0-9_]+)",', src[a:src.index(stop, a)], re.M)


def cases(shape):
    out = []
    for binary, only, fn, stop in SUITES:
        names = (table(binary, fn, stop) if fn else [None]) + EXTRA.get(only, [])
        for c in names:
            env = {"QT_TEST_SHAPE": shape, "QT_TEST_ONLY": only}
            if c:
                env["QT_TEST_CASES"] = c
            out.append((f"{shape}_{binary}_{c or only}", env, f"build/tests/{binary}"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True)
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--budget", type=float, default=3000, help="seconds for all cases")
    ap.add_argument("--log", default="out/bitwise_lanes")
    ap.add_argument("--only", default="", help="run only the cases whose name matches this regex")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    todo = [c for c in cases(a.shape) if re.search(a.only, c[0])]
    if a.list:
        for name, env, binary in todo:
            print(" ".join(f"{k}={v}" for k, v in env.items()), binary)
        return 0
    os.makedirs(a.log, exist_ok=True)
    end = time.time() + a.budget

    def run(case):
        name, env, binary = case
        left = end - time.time()
        if left < 20:
            return name, "NOT RUN", "the budget was spent", 0
        t0 = time.time()
        log = os.path.join(a.log, name + ".log")
        with open(log, "w") as f:
            try:
                rc = subprocess.run([binary], env={**os.environ, "OMP_NUM_THREADS": "1", **env}, stdout=f,
                                    stderr=subprocess.STDOUT, timeout=left).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        text = open(log, errors="replace").read()
        equal = text.count("bitwise equal")
        fails = [ln for ln in text.splitlines() if ln.startswith("FAIL")]
        skips = [ln for ln in text.splitlines() if ln.startswith("SKIP")]
        ok = rc == 0 and not fails and "PASS" in text
        why = fails[0] if fails else f"{equal} comparisons bitwise equal" if ok else skips[0] if skips else f"exit {rc}"
        verdict = ("PASS" if ok else "FAIL" if fails else "TIMEOUT" if rc == "timeout" else
                   "SKIP" if skips and rc == 0 else "FAIL")
        return name, verdict, why, time.time() - t0

    bad = 0
    with cf.ThreadPoolExecutor(a.lanes) as ex:
        for name, verdict, why, s in ex.map(run, todo):
            bad += verdict != "PASS"
            print(f"{verdict} {name} ({s:.0f} s): {why}", flush=True)
    print(f"bitwise_lanes {a.shape}: {len(todo) - bad} of {len(todo)} cases pass")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
