#!/usr/bin/env bash
# prereqs.sh — what `make` needs from the machine, checked before anything compiles.
#
#   tools/prereqs.sh cudnn   prints "MAJOR LIBDIR": the cuDNN major version of the cudnn_version.h the
#                            build compiles against, and the directory of the libcudnn.so.MAJOR whose
#                            cudnnGetVersion() matches it: the first of python3's nvidia-cudnn wheel,
#                            the headers' and toolkit's lib dirs and ldconfig's cache that holds
#                            MAJOR.MINOR or later (CUDNN_LIB set: that directory, checked);
#                            prints nothing when there is no such header or library.
#   tools/prereqs.sh cudnn-wheel   prints the lib directory of python3's nvidia-cudnn wheel, if any.
#   tools/prereqs.sh check   checks gcc, the headers (libyaml, zstd; the CUDA build: cuBLASLt, cuDNN),
#                            nvcc and that library (the CUDA build), and with PY_PACKAGES=1 python3's
#                            numpy; prints what is missing with the commands that install it and exits 1.
#                            Optional pieces (python3's headers for the binding; with PY_PACKAGES=1
#                            matplotlib, tokenizers, safetensors for tools/ and the tests that skip
#                            without them) get a note, not a stop.
#   tools/prereqs.sh install the same, but when something required is missing first installs what it
#                            can, the optional pieces with it: Debian packages with apt-get when run as
#                            root; Python packages into python3's own environment — pip when python3 is
#                            a venv, pyenv or conda python (the user's), apt-get's python3-numpy when it
#                            is the distribution's /usr python (whose pip refuses system installs: PEP
#                            668). The CUDA toolkit and cuDNN are never installed (NVIDIA's repository,
#                            gigabytes): without nvcc the build is CPU-only.
#   tools/prereqs.sh dry-run the same as install, but prints the install commands instead of running them.
# Inputs (from the Makefile): CC, CUDA_HOME, NVCC, CUDNN_LIB (optional override), CPU (1: the CPU-only
# build, no CUDA checks), PYTHON (default python3), PY_PACKAGES (1: check python3's packages; default 1).
set -uo pipefail
CC=${CC:-cc} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVCC=${NVCC:-$CUDA_HOME/bin/nvcc} CUDNN_LIB=${CUDNN_LIB:-}
CPU=${CPU:-0} PYTHON=${PYTHON:-python3} PY_PACKAGES=${PY_PACKAGES:-1} DRY_RUN=0

# Preprocesses "#include <$1>" followed by $2 as the build does (same compiler, same -I); prints the
# last output line (the expansion of $2); fails when the header is not found.
expand() {
    printf '#include <%s>\n%s\n' "$1" "${2:-}" | $CC -I"$CUDA_HOME/include" -E -P -x c - 2>/dev/null | tail -n 1
}
has() { expand "$1" > /dev/null; }

# cudnnGetVersion() of a libcudnn.so (e.g. 91900), by loading it in a throwaway probe: the file name
# alone does not say the minor version (pip's and the toolkit's copies are plain libcudnn.so.9).
lib_version() {
    local probe
    probe=$(mktemp -d) || return 1
    printf '%s\n' '#include <dlfcn.h>' '#include <stdio.h>' \
        'int main(int c, char **v) { (void)c; void *h = dlopen(v[1], RTLD_NOW | RTLD_LOCAL);' \
        '  size_t (*f)(void) = h ? (size_t (*)(void))dlsym(h, "cudnnGetVersion") : 0;' \
        '  if (!f) return 1; printf("%zu\n", f()); return 0; }' > "$probe/p.c"
    $CC "$probe/p.c" -o "$probe/p" -ldl 2>/dev/null && "$probe/p" "$1"
    local rc=$?
    rm -rf "$probe"
    return $rc
}

# The lib directory of python3's nvidia-cudnn wheel.
wheel_lib() {
    python3 - 2>/dev/null <<'PY'
import os, nvidia.cudnn as m  # a namespace package in recent wheels: no __file__
print(os.path.join(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0], "lib"))
PY
}

# Directories that may hold libcudnn: python3's nvidia-cudnn wheel, next to the headers, the toolkit,
# then the dynamic linker's cache.
candidates() {
    wheel_lib
    local inc; inc=$(dirname "$header")
    printf '%s\n' "$inc/../lib64" "$inc/../lib" "$inc/../lib/x86_64-linux-gnu" "$CUDA_HOME/lib64" "$CUDA_HOME/lib"
    ldconfig -p 2>/dev/null | awk '/libcudnn\.so\.[0-9]+ /{ sub(/\/[^\/]*$/, "", $NF); print $NF }'
}

find_cudnn() {   # sets major, minor, header, libdir (empty when not found)
    libdir=
    read -r major minor < <(expand cudnn_version.h 'CUDNN_MAJOR CUDNN_MINOR') || true
    [[ ${major:-} =~ ^[0-9]+$ && ${minor:-} =~ ^[0-9]+$ ]] || { major=; return; }
    header=$(printf '#include <cudnn_version.h>\n' | $CC -I"$CUDA_HOME/include" -E -x c - 2>/dev/null |
             awk -F'"' '/cudnn_version\.h"/{ print $2; exit }')
    local d
    if [ -n "$CUDNN_LIB" ]; then
        matches "$CUDNN_LIB" && libdir=$CUDNN_LIB
        return
    fi
    while read -r d; do
        if matches "$d"; then libdir=$(cd "$d" && pwd); return; fi
    done < <(candidates)
}

# Whether dir $1 holds a libcudnn.so.$major of version $major.$minor or a later $major.x (cuDNN runs
# programs built against older headers of the same major version).
matches() {
    local v
    [ -e "$1/libcudnn.so.$major" ] && v=$(lib_version "$1/libcudnn.so.$major") &&
        [ $((v / 10000)) -eq "$major" ] && [ $((v / 100 % 100)) -ge "$minor" ]
}

# ---- check and install ----
# survey fills: missing (lines for the user), apt (Debian packages that provide them), pip (Python
# packages for a user-managed python3), cuda (1: something only NVIDIA's repository provides), and the
# same for the optional pieces: notes, opt_apt, opt_pip; opt_cmd: the distribution's python3-* packages
# for the optional Python packages, named but not installed (python3-matplotlib alone pulls in hundreds
# of MB; tokenizers and safetensors are not packaged everywhere).
py() { $PYTHON -c "$1" >/dev/null 2>&1; }
# 1 when python3 is the distribution's (/usr, no venv): its packages come from apt-get, not pip.
distro_python() { py 'import sys; sys.exit(not (sys.prefix == sys.base_prefix and sys.prefix.startswith("/usr")))'; }
survey() {
    missing=() apt=() pip=() cuda=0 notes=() opt_apt=() opt_pip=() opt_cmd=()
    need() { missing+=("  $1"); [ -n "${2:-}" ] && apt+=("$2"); }
    command -v "${CC%% *}" >/dev/null || need "$CC (the C compiler, with OpenMP)" gcc
    has yaml.h || need "yaml.h (libyaml headers)" libyaml-dev
    has zstd.h || need "zstd.h (zstd headers)" libzstd-dev
    if [ "$CPU" != 1 ]; then
        [ -x "$NVCC" ] || { need "nvcc ($NVCC): the CUDA toolkit 13; set CUDA_HOME=dir if it is elsewhere"; cuda=1; }
        has cublasLt.h || { need "cublasLt.h (cuBLASLt headers, part of the CUDA toolkit)"; cuda=1; }
        find_cudnn
        if [ -z "$major" ] || ! has cudnn.h; then
            need "cudnn.h, cudnn_version.h (cuDNN 9 headers) under $CUDA_HOME/include or /usr/include"; cuda=1
        elif [ -z "$libdir" ]; then
            need "libcudnn.so.$major version $major.$minor or later (matching $header)${CUDNN_LIB:+ in \
CUDNN_LIB=$CUDNN_LIB}; set CUDNN_LIB=dir to name its directory"; cuda=1
        fi
    fi
    if ! command -v "${PYTHON%% *}" >/dev/null; then
        if [ "$PY_PACKAGES" = 1 ]; then need "$PYTHON (Python 3, for tools/ and the tests)" python3
        else notes+=("  $PYTHON: the Python binding is not built"); opt_apt+=(python3-dev); fi
        return 0
    fi
    local distro=0; distro_python && distro=1
    py 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' || {
        notes+=("  python3's headers: the Python binding is not built")
        [ $distro = 1 ] && opt_apt+=(python3-dev)
    }
    [ "$PY_PACKAGES" = 1 ] || return 0
    py 'import numpy' || {
        missing+=("  numpy for $PYTHON (tools/tokenize, the Python binding's tests)")
        if [ $distro = 1 ]; then apt+=(python3-numpy); else pip+=(numpy); fi
    }
    local m
    for m in matplotlib tokenizers safetensors; do
        py "import $m" && continue
        notes+=("  the $m package for $PYTHON: tools/ and tests that need it skip")
        if [ $distro = 0 ]; then opt_pip+=("$m"); else opt_cmd+=("python3-$m"); fi
    done
}

# Runs "$@" (output to stderr), or prints it in dry-run mode (and fails: nothing was installed).
run() {
    [ "$DRY_RUN" = 1 ] && { echo "prereqs: would run: $*" >&2; return 1; }
    echo "prereqs: installing: $*" >&2
    "$@" >&2
}
apt_install() {
    [ $# -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
    if [ "$DRY_RUN" != 1 ] && [ -z "${apt_updated:-}" ]; then
        apt_updated=1
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || return 1
    fi
    DEBIAN_FRONTEND=noninteractive run apt-get install -y -qq --no-install-recommends "$@"
}
pip_install() {
    [ $# -gt 0 ] || return 1
    py 'import pip' || run $PYTHON -m ensurepip --upgrade || return 1
    run $PYTHON -m pip install -q "$@"
}
uniq_words() { printf '%s\n' "$@" | awk 'NF && !seen[$0]++' | tr '\n' ' ' | sed 's/ $//'; }

report() {   # the stop: what is missing and the commands that install it
    local sudo=; [ "$(id -u)" = 0 ] || sudo="sudo "
    {
        echo "make: the build needs what this machine lacks:"
        printf '%s\n' "${missing[@]}"
        echo "install with:"
        [ ${#apt[@]} -gt 0 ] && echo "  ${sudo}apt-get install $(uniq_words "${apt[@]}")"
        [ ${#pip[@]} -gt 0 ] && echo "  $PYTHON -m pip install $(uniq_words "${pip[@]}")"
        if [ "$cuda" = 1 ]; then
            echo "  the CUDA toolkit 13 (nvcc, cuBLASLt) and cuDNN 9 from NVIDIA's apt repository" \
                 "(https://developer.nvidia.com/cuda-downloads): apt-get install cuda-toolkit-13-0 cudnn9-cuda-13"
            echo "or build without CUDA (the CPU trainer, tokenizer, binding and tests): make CPU=1"
        fi
        echo "then run make again."
    } >&2
}

case ${1:-} in
cudnn-wheel)
    wheel_lib; exit 0 ;;
cudnn)
    find_cudnn
    [ -n "$major" ] && [ -n "$libdir" ] && echo "$major $libdir"
    exit 0 ;;
check|install|dry-run)
    [ "$1" = dry-run ] && DRY_RUN=1
    survey
    # Installs only when something required is missing (the first set-up), the optional pieces with it:
    # a failing optional install (offline, no wheel) is not retried by every make. Twice: python3
    # installed in round 1 may lack numpy.
    for round in 1 2; do
        [ "$1" != check ] && [ ${#missing[@]} -gt 0 ] || break
        installed=0
        apt_install $(uniq_words "${apt[@]}") && installed=1
        apt_install $(uniq_words "${opt_apt[@]}") && installed=1
        pip_install $(uniq_words "${pip[@]}") && installed=1
        pip_install $(uniq_words "${opt_pip[@]}") && installed=1
        survey
        [ $installed = 1 ] || break
    done
    if [ ${#notes[@]} -gt 0 ]; then
        {
            echo "make: optional, missing:"
            printf '%s\n' "${notes[@]}"
            [ ${#opt_apt[@]} -gt 0 ] && echo "  (as root: apt-get install $(uniq_words "${opt_apt[@]}"))"
            [ ${#opt_pip[@]} -gt 0 ] && echo "  ($PYTHON -m pip install $(uniq_words "${opt_pip[@]}"))"
            [ ${#opt_cmd[@]} -gt 0 ] && echo "  (where packaged: apt-get install $(uniq_words "${opt_cmd[@]}");" \
                                             "or in a venv: pip install ${opt_cmd[*]//python3-/})"
        } >&2
    fi
    [ ${#missing[@]} -eq 0 ] && exit 0
    report
    exit 1 ;;
*)
    echo "usage: tools/prereqs.sh cudnn|cudnn-wheel|check|install|dry-run" >&2; exit 2 ;;
esac
