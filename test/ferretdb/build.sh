#!/usr/bin/env bash
# Builds test/ferretdb/bin/ferretdb-test (FerretDB v1.24.2, embeddable package,
# SQLite backend) once; a later call with the binary present and newer than
# main.go/go.mod/go.sum does nothing. Modules come from the Go module proxy
# (GOPROXY default). The first build takes a few minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/bin/ferretdb-test
if [[ -x $bin && $bin -nt $here/main.go && $bin -nt $here/go.mod && $bin -nt $here/go.sum ]]; then
    exit 0
fi
# Any Go >= 1.21 (scripts/install-deps.sh installs one): with GOTOOLCHAIN=auto it
# fetches the toolchain go.mod asks for from the Go module proxy.
go=
for g in "$(command -v go 2>/dev/null)" /usr/local/go/bin/go /usr/lib/go-1.2[1-9]/bin/go; do
    [[ -n "$g" && -x "$g" ]] || continue
    v=$("$g" env GOVERSION 2>/dev/null) || continue
    [[ "$(printf '%s\n' go1.21 "$v" | sort -V | head -n 1)" == go1.21 ]] && { go=$g; break; }
done
[[ -n "$go" ]] || { echo "ferretdb build: no Go found (run scripts/install-deps.sh)" >&2; exit 1; }
mkdir -p "$here/bin"
cd "$here"
echo "ferretdb build: building $bin with $go (first time takes minutes)" >&2
GOTOOLCHAIN=auto GOFLAGS=-mod=mod CGO_ENABLED=0 "$go" build -trimpath -o "$bin.tmp" .
mv "$bin.tmp" "$bin"
