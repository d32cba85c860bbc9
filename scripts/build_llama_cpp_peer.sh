#!/usr/bin/env bash
# Builds llama.cpp's CPU `llama-bench` and gathers its HF -> GGUF converter, from the llama.cpp source
# vendored in the `llama-cpp-python` sdist on PyPI: the CPU peer of docs/benchmarks.md (issue 19). A peer,
# never a dependency: nothing in the project links or imports it.
#
#     scripts/build_llama_cpp_peer.sh [OUT_DIR]          # default OUT_DIR: target/llama-cpp-peer
#
# Needs python3 with pip (PyPI), cmake >= 3.21 (`pip install cmake` will do), a C/C++ compiler and the
# static C/C++ runtimes (glibc's libc.a, libstdc++.a, libgomp.a: Debian's libc6-dev and g++ ship them).
#
# The instruction set is chosen, not detected: GGML_NATIVE=OFF with AVX, AVX2, FMA, F16C and BMI2 on and
# every AVX-512 flag off, so on an AVX-512 machine the binary runs what an AVX2-only CPU (AMD Zen 2/3, Intel
# client CPUs) would run. It is linked statically, so it can be copied to another x86-64 Linux machine
# (the linker warns that dlopen, getpwuid and getaddrinfo would need the build's glibc at run time: dynamic
# backends, the home-directory lookup and HTTP, none of which `llama-bench -m FILE` reaches).
#
# Leaves in OUT_DIR:
#   bin/llama-bench            the static binary
#   convert/                   convert_hf_to_gguf.py with its conversion/ and gguf-py/ packages
#   llama-cpp-peer.tar.xz      bin/ + convert/ + BUILD_INFO, the bundle to carry to a machine with no network
#   BUILD_INFO                 sdist version and sha256, the vendored llama.cpp commit, the cmake flags
set -euo pipefail

# shellcheck source=scripts/llama_cpp_source.sh
source "$(dirname "$0")/llama_cpp_source.sh"

out=$(realpath -m "${1:-target/llama-cpp-peer}")
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"

command -v cmake >/dev/null || { echo "build_llama_cpp_peer: cmake not found on PATH (pip install cmake)" >&2; exit 1; }

src=$(llama_cpp_source "$out")

cmake_flags=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_STATIC=ON
    -DCMAKE_EXE_LINKER_FLAGS=-static
    -DGGML_NATIVE=OFF
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    -DGGML_AVX_VNNI=OFF
    -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF
    -DGGML_OPENMP=ON
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
)
build="$out/build"
cmake -S "$src" -B "$build" "${cmake_flags[@]}" > "$out/cmake-configure.log"
cmake --build "$build" --target llama-bench -j "$jobs" > "$out/cmake-build.log"

mkdir -p "$out/bin"
cp "$build/bin/llama-bench" "$out/bin/llama-bench"
strip "$out/bin/llama-bench"
if ! file "$out/bin/llama-bench" | grep -q "statically linked"; then
    echo "build_llama_cpp_peer: bin/llama-bench is not statically linked: $(file "$out/bin/llama-bench")" >&2
    exit 1
fi
# The chosen ISA, as the compiler saw it: the ggml-cpu objects must hold AVX2 FMA code and no AVX-512
# (a zmm register appears only in AVX-512 code).
if objdump -d --no-show-raw-insn "$out/bin/llama-bench" | grep -q '%zmm'; then
    echo "build_llama_cpp_peer: bin/llama-bench contains AVX-512 instructions" >&2
    exit 1
fi

rm -rf "$out/convert"
mkdir -p "$out/convert"
cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$out/convert/"
find "$out/convert" -name __pycache__ -prune -exec rm -rf {} +

commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo "not recorded in the sdist")
{
    echo "llama-cpp-python sdist $SDIST_VERSION sha256 $SDIST_SHA256"
    echo "vendored llama.cpp commit: $commit"
    echo "compiler: $(c++ --version | head -1)"
    echo "cmake flags: ${cmake_flags[*]}"
    echo "built on: $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
} > "$out/BUILD_INFO"
cp "$out/BUILD_INFO" "$out/bin/BUILD_INFO"

tar -cJf "$out/llama-cpp-peer.tar.xz" -C "$out" bin convert BUILD_INFO
echo "llama-bench: $out/bin/llama-bench"
echo "bundle to carry: $out/llama-cpp-peer.tar.xz ($(du -h "$out/llama-cpp-peer.tar.xz" | cut -f1))"
