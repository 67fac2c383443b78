#!/usr/bin/env python3
"""test_build.py — what `make` needs from the machine: a missing header stops the build before anything
compiles, naming the package and the apt-get line, and PREREQS=install would install it (shown with
PREREQS=dry-run); cuDNN is the library that matches the headers we compile against (tools/prereqs.sh),
and the binaries' RUNPATH names its directory, no machine's path. Without nvcc the build is CPU-only:
the trainer builds with gcc, libyaml and zstd alone (no CUDA header reached) and trains on the CPU."""
import ctypes
import os
import re
import shutil
import subprocess
import sys

from qt_test import BUILD, ROOT, Skip, cpu_only_build, run_tests

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")


def make(*args, timeout=120, **env_over):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(env_over)
    return subprocess.run(["make", "--no-print-directory", "-C", ROOT, *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def fake_toolkit(tmp, headers):
    """A CUDA_HOME with empty stand-ins for the given headers and an nvcc that fails if ever run."""
    os.makedirs(os.path.join(tmp, "include"))
    os.makedirs(os.path.join(tmp, "bin"))
    for h in headers:
        with open(os.path.join(tmp, "include", h), "w") as f:
            f.write("#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 19\n" if h == "cudnn_version.h" else "\n")
    nvcc = os.path.join(tmp, "bin", "nvcc")
    with open(nvcc, "w") as f:
        f.write("#!/bin/sh\necho fake nvcc ran >&2; exit 1\n")
    os.chmod(nvcc, 0o755)


def test_missing_header_stops_make(tmp):
    if not shutil.which("make") or not shutil.which("gcc"):
        raise Skip("needs make and gcc")
    # -nostdinc hides the system's headers: only the fake toolkit's are found, zstd.h is not among them.
    fake_toolkit(tmp, ["yaml.h", "cublasLt.h", "cudnn.h", "cudnn_version.h"])
    r = make(f"BUILD={tmp}/build", "CC=gcc -nostdinc", f"CUDA_HOME={tmp}", "PREREQS=check")
    out = r.stdout + r.stderr
    assert r.returncode != 0, "make succeeded without zstd.h"
    assert "zstd.h" in out and re.search(r"apt-get install .*libzstd-dev", out), f"no apt-get line:\n{out}"
    assert "yaml.h" not in out and "libyaml-dev" not in out, f"yaml.h reported missing though present:\n{out}"
    objs = [f for _, _, fs in os.walk(os.path.join(tmp, "build")) for f in fs if f.endswith(".o")]
    assert not objs and "fake nvcc ran" not in out, f"compiled before checking: {objs[:3]}"


def test_missing_toolkit(tmp):
    """CPU=0 insists on CUDA: a missing nvcc stops it, naming the toolkit and the CPU-only way out."""
    r = make(f"BUILD={tmp}/build", f"CUDA_HOME={tmp}/none", "CPU=0", "PREREQS=check", "prereqs")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and f"nvcc ({tmp}/none/bin/nvcc)" in out and "CUDA_HOME" in out, out
    assert "make CPU=1" in out, f"no CPU-only hint:\n{out}"


def test_missing_install_dry_run(tmp):
    """PREREQS=dry-run shows what PREREQS=install runs for a missing header and a python3 without numpy
    (python3 -S: no site-packages), then stops with the commands; nothing is installed."""
    r = make(f"BUILD={tmp}/build", "CPU=1", "CC=gcc -nostdinc", "PYTHON=python3 -S", "PREREQS=dry-run", "prereqs")
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"make prereqs succeeded without zstd.h and numpy:\n{out}"
    # numpy: the distribution's python3 takes apt-get's python3-numpy, a venv's or pyenv's its pip
    distro = subprocess.run(["python3", "-S", "-c", "import sys; sys.exit(not (sys.prefix == sys.base_prefix and "
                             "sys.prefix.startswith('/usr')))"]).returncode == 0
    numpy_apt = " python3-numpy" if distro else ""
    assert re.search(rf"^install with:\n  (sudo )?apt-get install libyaml-dev libzstd-dev{numpy_apt}$", out, re.M), out
    assert distro or re.search(r"^  python3 -S -m pip install numpy$", out, re.M), f"no pip line for numpy:\n{out}"
    if os.geteuid() == 0 and shutil.which("apt-get"):
        assert re.search(rf"^prereqs: would run: apt-get install .*libyaml-dev libzstd-dev{numpy_apt}$", out, re.M), out
    assert "prereqs: installing:" not in out, f"dry-run installed something:\n{out}"
    assert "nvcc" not in out and "cuDNN" not in out, f"the CPU-only build asked for CUDA:\n{out}"


def test_prereqs_present(tmp):
    r = make(f"BUILD={tmp}/build", "PREREQS=check", "prereqs")
    assert r.returncode == 0 and "lacks" not in r.stderr, f"make prereqs on this machine: {r.stderr}"


def header_version():
    """(major, minor) of the cudnn_version.h the build's compiler sees (-I$CUDA_HOME/include, then the
    system's), or None."""
    r = subprocess.run(["gcc", f"-I{CUDA_HOME}/include", "-E", "-P", "-x", "c", "-"], capture_output=True,
                       text=True, input="#include <cudnn_version.h>\nCUDNN_MAJOR CUDNN_MINOR\n")
    last = r.stdout.split()[-2:]
    return tuple(map(int, last)) if r.returncode == 0 and len(last) == 2 and all(x.isdigit() for x in last) else None


def fake_cudnn(d, version):
    """d/libcudnn.so.MAJOR whose cudnnGetVersion() returns version, nothing else."""
    os.makedirs(d, exist_ok=True)
    src = os.path.join(d, "v.c")
    open(src, "w").write(f"#include <stddef.h>\nsize_t cudnnGetVersion(void) {{ return {version}; }}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", src, "-o", os.path.join(d, f"libcudnn.so.{version // 10000}")],
                   check=True)


def test_cudnn_choice(tmp):
    """prereqs.sh cudnn skips a library older than the headers and prefers python3's wheel when it fits."""
    if not header_version():
        raise Skip("no cudnn_version.h here")
    major, minor = header_version()
    older, same, newer = (major * 10000 + m * 100 for m in (minor - 1, minor, minor + 1))
    script = os.path.join(ROOT, "tools", "prereqs.sh")

    def choose(**env):
        r = subprocess.run(["bash", script, "cudnn"], capture_output=True, text=True, env={**os.environ, **env})
        return r.stdout.split()[1] if r.stdout.strip() else None
    for version, ok in ((older, False), (same, True), (newer, True)):
        d = os.path.join(tmp, f"lib{version}")
        fake_cudnn(d, version)
        got = choose(CUDNN_LIB=d)
        assert (got == d) == ok, f"CUDNN_LIB with cuDNN {version}, headers {major}.{minor}: chose {got}"
        wheel = os.path.join(tmp, f"py{version}")
        fake_cudnn(os.path.join(wheel, "nvidia", "cudnn", "lib"), version)
        got = choose(PYTHONPATH=wheel)
        assert (got == os.path.join(wheel, "nvidia", "cudnn", "lib")) == ok, \
            f"wheel with cuDNN {version}, headers {major}.{minor}: chose {got}"


def test_cudnn_matches_headers(tmp):
    r = subprocess.run(["bash", os.path.join(ROOT, "tools", "prereqs.sh"), "cudnn"], capture_output=True, text=True)
    assert r.returncode == 0, f"tools/prereqs.sh cudnn: {r.stderr}"
    if not r.stdout.strip():
        raise Skip("no cuDNN here")
    major, libdir = r.stdout.split()
    want = header_version()
    got = ctypes.CDLL(os.path.join(libdir, f"libcudnn.so.{major}")).cudnnGetVersion()
    assert got // 10000 == want[0] and got // 100 % 100 >= want[1], f"{libdir}: cuDNN {got}, headers {want}"
    # CUDNN_LIB names the directory; one without a matching library is refused.
    r = make(f"BUILD={tmp}/build", f"CUDNN_LIB={tmp}", "CPU=0", "PREREQS=check", "prereqs")
    assert r.returncode != 0 and f"CUDNN_LIB={tmp}" in r.stderr, r.stderr
    if not shutil.which("readelf") or not os.path.exists(os.path.join(BUILD, "qtrain")) or cpu_only_build():
        raise Skip("readelf or build/qtrain missing, or a CPU-only build (no cuDNN linked): RUNPATH not checked")
    dyn = subprocess.run(["readelf", "-d", os.path.join(BUILD, "qtrain")], capture_output=True, text=True).stdout
    m = re.search(r"\((RUNPATH|RPATH)\)\s+Library r\w*path: \[(.*)\]", dyn)
    # RUNPATH, not RPATH: LD_LIBRARY_PATH must still win on a machine where another cuDNN is wanted.
    assert m and m.group(1) == "RUNPATH" and m.group(2).split(":") == [libdir], f"build/qtrain: {m and m.group(0)}"


def path_without_nvcc():
    """PATH less the directories that hold an nvcc (None when the system's own directories hold one)."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not os.path.exists(os.path.join(d, "nvcc"))]
    return None if any(os.path.exists(os.path.join(d, "nvcc")) for d in ("/usr/bin", "/bin")) else os.pathsep.join(dirs)


def test_cpu_only_build(tmp):
    """Without nvcc (CUDA_HOME nowhere, none on PATH) make builds the CPU-only variant: no CUDA header is
    reached (each is an #error stand-in here), no CUDA library is linked; the trainer trains on the CPU, and
    device: cuda is refused with "built without CUDA"."""
    path = path_without_nvcc()
    if path is None or not shutil.which("gcc"):
        raise Skip("nvcc in /usr/bin, or no gcc: a PATH without nvcc cannot be made")
    poison = os.path.join(tmp, "poison")
    os.makedirs(poison)
    for h in ("cuda.h", "cuda_runtime.h", "cuda_runtime_api.h", "cublasLt.h", "cudnn.h", "cuda_bf16.h", "cuda_fp8.h"):
        open(os.path.join(poison, h), "w").write(f'#error "{h} reached in the CPU-only build"\n')
    b = os.path.join(tmp, "build")
    r = make(f"BUILD={b}", f"EXTRA_CFLAGS=-I{poison}", "PREREQS=check", f"{b}/qtrain", f"{b}/tests/test_optim",
             timeout=600, PATH=path, CUDA_HOME=os.path.join(tmp, "nowhere"))
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"CPU-only build failed:\n{out[-4000:]}"
    assert "the CPU-only build" in out and not re.search(r"^\S*nvcc ", out, re.M), out[-4000:]
    libs = subprocess.run(["ldd", f"{b}/qtrain"], capture_output=True, text=True).stdout
    assert not re.search(r"libcuda|libcudart|libcublas|libcudnn", libs), f"CUDA library linked:\n{libs}"
    t = subprocess.run([f"{b}/tests/test_optim"], capture_output=True, text=True, timeout=300)
    assert t.returncode == 0 and "PASS" in t.stdout, f"test_optim of the CPU-only build:\n{t.stdout}{t.stderr}"
    # A tiny corpus and a few CPU steps.
    data, corpus = os.path.join(tmp, "data"), os.path.join(tmp, "corpus.txt")
    open(corpus, "w").write("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    tok = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tokenize"), "--byte-level", corpus, "--out", data,
                          "--eval-frac", "0.1", "--quiet"], capture_output=True, text=True, timeout=120)
    assert tok.returncode == 0, tok.stderr
    args = [f"{b}/qtrain", os.path.join(ROOT, "configs", "tiny-cpu.yaml"), "--set", f"data.train={data}/train_*.bin",
            "--set", f"data.eval={data}/eval_*.bin", "--set", "data.seq_len=32", "--set", "data.micro_batch=2",
            "--set", "optim.steps=3", "--set", "optim.warmup=1", "--set", "eval.every=0",
            "--set", f"checkpoint.dir={tmp}/ckpt", "--set", f"log.file={tmp}/log.jsonl"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp)
    assert run.returncode == 0, f"CPU-only trainer:\n{run.stdout}{run.stderr}"
    assert "training on the CPU" in run.stdout and re.search(r"step +3/3 \| loss \d", run.stdout), run.stdout
    gpu = subprocess.run(args + ["--set", "device=cuda", "--set", f"checkpoint.dir={tmp}/ckpt2",
                                 "--set", f"log.file={tmp}/log2.jsonl"], capture_output=True, text=True, timeout=60, cwd=tmp)
    assert gpu.returncode != 0 and "built without CUDA: rebuild with the CUDA toolkit" in gpu.stderr, gpu.stderr


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
