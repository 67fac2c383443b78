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
#   tools/prereqs.sh check   checks the headers (libyaml, zstd, cuBLASLt, cuDNN), nvcc and that library;
#                            prints what is missing with the command that installs it and exits 1.
# Inputs (from the Makefile): CC, CUDA_HOME, NVCC, CUDNN_LIB (optional override).
set -uo pipefail
CC=${CC:-cc} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVCC=${NVCC:-$CUDA_HOME/bin/nvcc} CUDNN_LIB=${CUDNN_LIB:-}

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

case ${1:-} in
cudnn-wheel)
    wheel_lib; exit 0 ;;
cudnn)
    find_cudnn
    [ -n "$major" ] && [ -n "$libdir" ] && echo "$major $libdir"
    exit 0 ;;
check)
    missing=() pkgs=()
    need() { missing+=("  $1"); pkgs+=("$2"); }   # what is missing, the Debian package that has it
    has yaml.h || need "yaml.h (libyaml headers)" libyaml-dev
    has zstd.h || need "zstd.h (zstd headers)" libzstd-dev
    [ -x "$NVCC" ] || need "nvcc ($NVCC): the CUDA toolkit 13; set CUDA_HOME=dir if it is elsewhere" \
        cuda-toolkit-13-0
    has cublasLt.h || need "cublasLt.h (cuBLASLt headers, part of the CUDA toolkit)" libcublas-dev-13-0
    find_cudnn
    if [ -z "$major" ] || ! has cudnn.h; then
        need "cudnn.h, cudnn_version.h (cuDNN 9 headers) under $CUDA_HOME/include or /usr/include" cudnn9-cuda-13
    elif [ -z "$libdir" ]; then
        need "libcudnn.so.$major version $major.$minor or later (matching $header)${CUDNN_LIB:+ in \
CUDNN_LIB=$CUDNN_LIB}; set CUDNN_LIB=dir to name its directory" cudnn9-cuda-13
    fi
    [ ${#missing[@]} -eq 0 ] && exit 0
    {
        echo "make: the build needs what this machine lacks:"
        printf '%s\n' "${missing[@]}"
        echo "install with:  apt-get install $(printf '%s\n' "${pkgs[@]}" | awk '!seen[$0]++' | tr '\n' ' ')"
        case " ${pkgs[*]} " in *cuda*|*cudnn*|*cublas*)
            echo "(the CUDA, cuBLAS and cuDNN packages come from NVIDIA's apt repository:" \
                 "https://developer.nvidia.com/cuda-downloads)";; esac
    } >&2
    exit 1 ;;
*)
    echo "usage: tools/prereqs.sh cudnn|cudnn-wheel|check" >&2; exit 2 ;;
esac
