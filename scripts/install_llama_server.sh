#!/usr/bin/env bash
# Build llama.cpp's C++ OpenAI-compatible server (`llama-server`) for the
# real-server tests, into a cache folder that survives between CI runs.
#
#   scripts/install_llama_server.sh        # prints the binary's path on stdout
#
# A second call is instant: the binary is versioned by name and reused.
# The source comes from a package registry, not from GitHub: llama-cpp-python's
# source distribution on PyPI vendors llama.cpp (vendor/llama.cpp), so
# `pip download --no-binary :all:` fetches it. CPU only, no curl, no OpenSSL,
# no web UI (nothing else is downloaded at build time), static libraries, only
# the server target. Needs cmake, a C++17 compiler and pip.
# Settings: MEMGPT_TOOLS_DIR (default ~/.cache/memgpt-bot/bin),
# LLAMA_CPP_PYTHON_VERSION (the sdist whose llama.cpp is built), BUILD_JOBS.
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
bin_dir="${MEMGPT_TOOLS_DIR:-$HOME/.cache/memgpt-bot/bin}"
# "-avx2": a portable x86-64 build. A -march=native build crashed at its first
# matrix product on machines whose CPU reports AMX that the VM does not grant
# (SIGSEGV in ggml_backend_amx_mul_mat), so the tests skipped every real server.
target="$bin_dir/llama-server-llama-cpp-python-$version-avx2"
jobs="${BUILD_JOBS:-2}"

if [[ -x "$target" ]] && "$target" --version >/dev/null 2>&1; then
    echo "$target"
    exit 0
fi

python_bin="$(command -v python3 || command -v python || true)"
for tool in cmake "${CXX:-c++}"; do
    if ! command -v "$tool" >/dev/null; then
        echo "install_llama_server: '$tool' is not installed (need cmake and a C++17 compiler)" >&2
        exit 1
    fi
done
if [[ -z "$python_bin" ]]; then
    echo "install_llama_server: python3 is not installed (pip fetches the source)" >&2
    exit 1
fi

mkdir -p "$bin_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "install_llama_server: building llama-server from llama-cpp-python $version's sdist (takes 10-30 minutes)" >&2
started=$SECONDS
"$python_bin" -m pip download -q --no-deps --no-binary :all: \
    "llama-cpp-python==$version" -d "$work" >&2
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
source_dir="$work/llama_cpp_python-$version/vendor/llama.cpp"
if [[ ! -f "$source_dir/tools/server/server.cpp" ]]; then
    echo "install_llama_server: llama-cpp-python $version's sdist has no vendored llama.cpp server" >&2
    exit 1
fi

cmake -S "$source_dir" -B "$work/build" -G "Unix Makefiles" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON >&2
cmake --build "$work/build" --target llama-server -j "$jobs" >&2
built="$work/build/bin/llama-server"
"$built" --version >/dev/null 2>&1
# Atomic: a concurrent run (or a reader) never sees a half-written binary.
cp -f "$built" "$target.tmp.$$"
mv -f "$target.tmp.$$" "$target"
echo "install_llama_server: built $target in $((SECONDS - started)) s" >&2
echo "$target"
