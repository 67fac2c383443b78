#!/usr/bin/env python3
"""mutant_guard.py [DIR...] — every planted bug of the library sits inside `#ifdef QT_MUTANTS ... #endif`.

Reads the C/CUDA sources and headers of src/, cuda/ and comm/ (or the DIRs given) line by line and
prints each line that names a mutant (a QT_MUT_ name, qt_mutant_on, qt_mutant_set) outside a block
compiled only with QT_MUTANTS: `#ifdef QT_MUTANTS`, `#if defined(QT_MUTANTS)` or the #else of
`#ifndef QT_MUTANTS`, nested #if blocks included (qt_mutant.h). Comments count too: a mutant's name
belongs to the mutant build. Exits 1 when there is such a line.

The library's pattern: the release statement stays as it is; the block either holds the planted alternative

    #ifdef QT_MUTANTS
        if (qt_mutant_on(QT_MUT_X)) offset = 0.0f;
    #endif

or sets a local that the release statement reads (0 in a release build):

    int no_wait = 0;
    #ifdef QT_MUTANTS
        no_wait = qt_mutant_on(QT_MUT_X);
    #endif
        if (!no_wait) QT_CUDA(cudaStreamWaitEvent(...));

qt_mutant.h itself is all inside #ifdef QT_MUTANTS, so any use outside such a block fails a release build."""
import glob
import re
import sys

DIRS = ("src", "cuda", "comm", "include")
EXTS = ("c", "h", "cu", "cuh")
MENTION = re.compile(r"\bQT_MUT_\w+|\bqt_mutant_(on|set)\b")
ON = re.compile(r"#\s*(ifdef\s+QT_MUTANTS|if\s+defined\s*\(?\s*QT_MUTANTS\s*\)?)\s*(/[*/].*)?$")
OFF = re.compile(r"#\s*(ifndef\s+QT_MUTANTS|if\s+!\s*defined\s*\(?\s*QT_MUTANTS\s*\)?)\s*(/[*/].*)?$")


def unguarded(path):
    """(line number, text) of each mention of a mutant outside a QT_MUTANTS-only block."""
    out = []
    stack = []  # per open #if: 1 its current branch is QT_MUTANTS-only, 0 it is not, None: neither way
    for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
        t = line.strip()
        if ON.match(t):
            stack.append(1)
        elif OFF.match(t):
            stack.append(0)
        elif re.match(r"#\s*if", t):
            stack.append(None)
        elif re.match(r"#\s*el", t) and stack:  # #else / #elif
            stack[-1] = {1: 0, 0: 1 if re.match(r"#\s*else", t) else None}.get(stack[-1])
        elif re.match(r"#\s*endif", t) and stack:
            stack.pop()
        elif MENTION.search(line) and 1 not in stack:
            out.append((n, line.rstrip()))
    return out


def main():
    bad = []
    for d in sys.argv[1:] or DIRS:
        for ext in EXTS:
            for path in sorted(glob.glob(d + "/**/*." + ext, recursive=True)):
                bad += [(path, n, text) for n, text in unguarded(path)]
    for path, n, text in bad:
        print(f"{path}:{n}: {text.strip()}")
    if bad:
        print(f"mutant_guard: {len(bad)} line(s) name a planted bug outside #ifdef QT_MUTANTS: a release build "
              "must compile none of them (include/qt_mutant.h)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
