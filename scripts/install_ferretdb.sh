#!/usr/bin/env bash
# Build FerretDB (a MongoDB wire-protocol server on an embedded SQLite file) for
# the MongoDB tests, into a cache folder that survives between CI runs.
#
#   scripts/install_ferretdb.sh        # prints the binary's path on stdout
#
# A second call is instant: the binary is versioned by name and reused. Needs Go
# (on PATH or in /usr/local/go/bin) and the Go module proxy; no cgo.
# Settings: MEMGPT_TOOLS_DIR (default ~/.cache/memgpt-bot/bin), FERRETDB_VERSION.
#
# Why not plain `go install github.com/FerretDB/FerretDB/cmd/ferretdb@v1.24.2`:
# that builds, but the binary panics at start ("Invalid build/version/version.txt
# file content"), because FerretDB embeds its version from a generated file that
# is absent from the module zip. So we copy the module source, write that file
# and build the copy.
set -euo pipefail

version="${FERRETDB_VERSION:-1.24.2}"
bin_dir="${MEMGPT_TOOLS_DIR:-$HOME/.cache/memgpt-bot/bin}"
target="$bin_dir/ferretdb-v$version"

if [[ -x "$target" ]] && "$target" --version >/dev/null 2>&1; then
    echo "$target"
    exit 0
fi

go_bin="$(command -v go || true)"
if [[ -z "$go_bin" && -x /usr/local/go/bin/go ]]; then
    go_bin=/usr/local/go/bin/go
fi
if [[ -z "$go_bin" ]]; then
    echo "install_ferretdb: Go is not installed (need 'go' on PATH or /usr/local/go/bin/go)" >&2
    exit 1
fi

mkdir -p "$bin_dir"
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null || true; rm -rf "$work"' EXIT

echo "install_ferretdb: building FerretDB v$version with $("$go_bin" version) (takes a minute or two)" >&2
started=$SECONDS
# Outside any module, so the project's files play no part; GOFLAGS from the
# environment could force -mod=vendor and the like, so it is cleared.
cd "$work"
module_dir="$(GOFLAGS= "$go_bin" mod download -json "github.com/FerretDB/FerretDB@v$version" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
if [[ -z "$module_dir" || ! -d "$module_dir" ]]; then
    echo "install_ferretdb: could not download github.com/FerretDB/FerretDB@v$version" >&2
    exit 1
fi
cp -R "$module_dir" "$work/src"
chmod -R u+w "$work/src"
echo "v$version" > "$work/src/build/version/version.txt"
cd "$work/src"
CGO_ENABLED=0 GOFLAGS=-buildvcs=false "$go_bin" build -o "$work/ferretdb" ./cmd/ferretdb
"$work/ferretdb" --version >/dev/null
# Atomic: a concurrent run (or a reader) never sees a half-written binary.
mv -f "$work/ferretdb" "$target.tmp.$$"
mv -f "$target.tmp.$$" "$target"
echo "install_ferretdb: built $target in $((SECONDS - started)) s" >&2
echo "$target"
