# The llama.cpp source both peers are built from (sourced by scripts/build_llama_cpp_peer.sh and
# scripts/llama_cpp_cuda_peer.sh): the copy vendored in one pinned `llama-cpp-python` sdist on PyPI.
# Its llama.cpp has the Qwen3.5 architecture (`qwen35` in src/llama-arch.cpp, src/models/qwen35.cpp;
# the converter registers Qwen3_5ForCausalLM and Qwen3_5ForConditionalGeneration in conversion/qwen.py).
SDIST_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

# llama_cpp_source DIR: the sdist fetched into DIR (kept there; fetched only if missing), checked against
# the pinned hash and unpacked; prints the path of its vendored llama.cpp. Exits on any mismatch.
llama_cpp_source() {
    local dir=$1 sdist src
    sdist="$dir/llama_cpp_python-$SDIST_VERSION.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        # --no-binary only for this package: pip fetches the sdist, its build backend comes as a wheel.
        "${PYTHON:-python3}" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$SDIST_VERSION" -d "$dir" >&2
    fi
    echo "$SDIST_SHA256  $sdist" | sha256sum --check --quiet \
        || { echo "llama.cpp source: $sdist does not have the pinned sha256" >&2; exit 1; }
    src="$dir/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"
    if [[ ! -d "$src" ]]; then
        tar -xzf "$sdist" -C "$dir"
    fi
    grep -q '"qwen35"' "$src/src/llama-arch.cpp" \
        || { echo "llama.cpp source: the vendored llama.cpp has no qwen35 architecture" >&2; exit 1; }
    echo "$src"
}
