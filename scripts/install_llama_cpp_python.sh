#!/usr/bin/env bash
# Make a virtualenv with llama-cpp-python's OpenAI-compatible server
# (`python -m llama_cpp.server`) for the real-server tests, in a cache folder
# that survives between CI runs (not the project's .venv, which CI recreates).
# The model comes from scripts/install_smollm2.sh.
#
#   scripts/install_llama_cpp_python.sh    # prints the venv's python on stdout
#
# A second call is instant. The first compiles llama.cpp through pip (about 30
# minutes on a busy 2-core machine) into the cached venv. CPU only (portable
# AVX2), without the multimodal library.
# Settings: MEMGPT_TOOLS_DIR (default ~/.cache/memgpt-bot/bin; the venv goes
# beside it), LLAMA_CPP_PYTHON_VERSION, BUILD_JOBS.
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
bin_dir="${MEMGPT_TOOLS_DIR:-$HOME/.cache/memgpt-bot/bin}"
# "-avx2": a portable build (see install_llama_server.sh: native builds crashed on AMX).
venv="$(dirname "$bin_dir")/llama-cpp-python-$version-avx2"
python="$venv/bin/python"
# Written last: a venv still being built (or half built) is never taken as ready.
marker="$venv/.memgpt-bot-ready"

ready() {
    [[ -f "$marker" && -x "$python" ]] && "$python" -c 'import llama_cpp.server' >/dev/null 2>&1
}
if ready; then
    echo "$python"
    exit 0
fi

base_python="$(command -v python3 || command -v python || true)"
if [[ -z "$base_python" ]]; then
    echo "install_llama_cpp_python: python3 is not installed" >&2
    exit 1
fi

echo "install_llama_cpp_python: building llama-cpp-python[server]==$version into $venv (about 30 minutes the first time)" >&2
started=$SECONDS
# An interrupted install is resumed: pip skips what the venv already has.
[[ -x "$python" ]] || "$base_python" -m venv "$venv"
"$python" -m pip install -q --upgrade pip >&2
# Only what the server needs: no multimodal (mtmd) library, no tests/examples/tools.
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON}"
export CMAKE_BUILD_PARALLEL_LEVEL="${BUILD_JOBS:-2}"
# --no-cache-dir: pip's wheel cache is keyed by the sdist, not by CMAKE_ARGS, and
# would hand back a wheel built with other flags (the venv itself is the cache).
"$python" -m pip install -q --no-cache-dir "llama-cpp-python[server]==$version" >&2
if ! "$python" -c 'import llama_cpp.server' >/dev/null 2>&1; then
    echo "install_llama_cpp_python: installed, but 'import llama_cpp.server' fails in $venv" >&2
    exit 1
fi
touch "$marker"
echo "install_llama_cpp_python: ready in $((SECONDS - started)) s" >&2
echo "$python"
