"""qt_test.py — the Python tests' harness (the counterpart of qt_test.h): runs every test_* function of
a test file in a fresh temporary directory and prints PASS/FAIL/SKIP lines that tests/run.sh counts."""
import os
import shutil
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))


def cpu_only_build():
    """True for a CPU-only build (make CPU=1, or no nvcc): $BUILD/gen/gpu_tests names the tests it left out."""
    try:
        return bool(open(os.path.join(BUILD, "gen", "gpu_tests")).read().split())
    except OSError:
        return False


class Skip(Exception):
    """Raised by a test that cannot run here; the message says why."""


def run_tests(names, only=()):
    """Runs each callable test_* in names (a module's globals()) as fn(tmpdir), only those named in only
    when it is not empty; returns the exit status."""
    failed = 0
    for name, fn in list(names.items()):
        if not name.startswith("test_") or not callable(fn) or (only and name not in only):
            continue
        tmp = tempfile.mkdtemp(prefix="qt_py_")
        try:
            fn(tmp)
            print(f"PASS {name}")
        except Skip as e:
            print(f"SKIP {name}: {e}")
        except Exception as e:  # noqa: BLE001 — any error is this test's failure
            failed += 1
            print(f"FAIL {name}: {e}")
            traceback.print_exc(limit=3, file=sys.stdout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        sys.stdout.flush()
    return 1 if failed else 0


def run_pytest(path, names):
    """Runs the test file at path under pytest (when installed) and prints one PASS/FAIL/SKIP line per
    test for tests/run.sh; without pytest, runs it with run_tests(names). Returns the exit status."""
    try:
        import pytest
    except ImportError:
        print("(pytest is not installed: running the tests with qt_test's own runner)")
        return run_tests(names)

    class Lines:
        def pytest_runtest_logreport(self, report):
            name = report.nodeid.split("::")[-1]
            if report.when == "call" or report.outcome != "passed":
                if report.skipped:
                    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                    print(f"SKIP {name}: {reason.removeprefix('Skipped: ')}")
                elif report.failed:
                    print(f"FAIL {name} ({report.when}): {str(report.longrepr).splitlines()[-1][:300]}")
                    print("    " + str(report.longrepr).replace("\n", "\n    "))
                elif report.when == "call":
                    print(f"PASS {name}")
            sys.stdout.flush()

    rc = pytest.main([path, "-p", "no:terminal", "-p", "no:cacheprovider"], plugins=[Lines()])
    return 0 if rc in (0, 5) else 1
