"""conftest.py — lets pytest run the Python tests written for qt_test's runner: the `tmp` argument is
a fresh temporary directory (a str), and qt_test.Skip becomes a pytest skip with its reason."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qt_test import Skip  # noqa: E402


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    args = {k: pyfuncitem.funcargs[k] for k in pyfuncitem._fixtureinfo.argnames}
    try:
        pyfuncitem.obj(**args)
    except Skip as e:
        pytest.skip(str(e))
    return True
