#!/usr/bin/env bash
# Runs every test binary in $BUILD/tests and every tests/test_*.py, prints their lines and ends with
# "N passed, N failed[, N skipped]". Exit status 1 when anything failed or a binary crashed. In the
# CPU-only build ($BUILD/gen/gpu_tests lists the tests it does not build) each of those counts as one SKIP.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
pass=0 fail=0 skip=0
failed=""  # the FAIL lines again at the end: CI shows only the output's tail
run_one() {
    local name=$1; shift
    local out rc
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out" | sed "s|^|[$name] |"
    local p f s
    p=$(printf '%s\n' "$out" | grep -c '^PASS ') ; f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    s=$(printf '%s\n' "$out" | grep -c '^SKIP ')
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    [ "$f" -gt 0 ] && failed+=$(printf '%s\n' "$out" | grep '^FAIL ' | sed "s|^|[$name] |")$'\n'
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "[$name] FAIL: exited with status $rc"; fail=$((fail + 1))
        failed+="[$name] FAIL: exited with status $rc"$'\n'
    fi
}
gpu_only=" $(cat "$BUILD/gen/gpu_tests" 2>/dev/null | tr '\n' ' ') "
for t in $gpu_only; do
    case $t in test_*)
        echo "[$t] SKIP: built without CUDA (the CPU-only build); rebuild with the CUDA toolkit to run it"
        skip=$((skip + 1)) ;;
    esac
done
for t in "$BUILD"/tests/test_*; do  # tool_* binaries are driven by the python tests
    [ -x "$t" ] && [ "${t%.o}" = "$t" ] && [ "${t%.d}" = "$t" ] || continue
    case $gpu_only in *" $(basename "$t") "*) continue ;; esac  # a stale binary of a CUDA build in $BUILD
    run_one "$(basename "$t")" "$t"
done
for py in tests/test_*.py; do
    [ -f "$py" ] || continue
    run_one "$(basename "$py")" env BUILD="$BUILD" python3 "$py"
done
[ -n "$failed" ] && printf 'failed:\n%s' "$failed"
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
