"""setup.py — the build step of the Python package (pyproject.toml holds the metadata): the extension
qtrain._qtrain is built by `make python` (the Makefile compiles the library and src/python/qtrain/
_qtrain.c against this interpreter) and copied into the wheel. make's variables come from the
environment as usual: `CUDA_ARCH=90a pip install .` builds for Hopper only."""
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class MakeExtension(build_ext):
    def build_extension(self, ext):
        jobs = str(min(os.cpu_count() or 1, 8))
        subprocess.check_call(["make", "-j" + jobs, "python", "PYTHON=" + sys.executable], cwd=ROOT)
        built = os.path.join(ROOT, "build", "python", "qtrain", "_qtrain" + sysconfig.get_config_var("EXT_SUFFIX"))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)


setup(ext_modules=[Extension("qtrain._qtrain", sources=[])], cmdclass={"build_ext": MakeExtension})
