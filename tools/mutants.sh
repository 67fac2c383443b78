#!/usr/bin/env bash
# mutants.sh REL_BUILD MUT_BUILD TEST... — `make test-mutants`: runs the mutant build's tests (each mutant
# test must catch its planted bugs; the GPU ones skip without a GPU), then checks that the release library
# REL_BUILD/libqtrain.a holds none of the planted bugs (include/qt_mutant.h) while the mutant build's does:
# no symbol and no string naming a mutant. Ends with "N passed, N failed, N skipped"; exit 1 on a failure.
set -u
cd "$(dirname "$0")/.."
rel=$1 mut=$2
shift 2
pass=0 fail=0 skip=0
for t in "$@"; do
    out=$("$mut/tests/$t" 2>&1)
    rc=$?
    printf '%s\n' "$out" | sed "s|^|[$t] |"
    p=$(grep -c '^PASS ' <<<"$out") f=$(grep -c '^FAIL ' <<<"$out") s=$(grep -c '^SKIP ' <<<"$out")
    pass=$((pass + p)) fail=$((fail + f)) skip=$((skip + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "[$t] FAIL: exited with status $rc"; fail=$((fail + 1)); fi
done
# The planted code names itself: qt_mutant_set/on, the QT_MUT_* enum, dp_sync.c's helpers and their
# messages. Debug info names the build's directory, which may contain the word: those strings are left out.
found() { # $1: library; prints what names a mutant
    { nm -A --defined-only "$1" 2>/dev/null | grep -iE 'mutant|stale_(fill|keep)'
      strings -a "$1" | grep -vF "$PWD" | grep -iE 'mutant|QT_MUT_|stale_(fill|keep)'; } | sort -u
}
rel_found=$(found "$rel/libqtrain.a")
if [ -n "$rel_found" ]; then
    printf 'FAIL release_has_no_mutants: %s/libqtrain.a holds:\n%s\n' "$rel" "$rel_found" | head -20
    fail=$((fail + 1))
elif [ -z "$(found "$mut/libqtrain.a")" ]; then
    echo "FAIL release_has_no_mutants: the check finds nothing in $mut/libqtrain.a either (it cannot fail)"
    fail=$((fail + 1))
else
    echo "PASS release_has_no_mutants ($rel/libqtrain.a; $(found "$mut/libqtrain.a" | wc -l) hits in $mut/libqtrain.a)"
    pass=$((pass + 1))
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
