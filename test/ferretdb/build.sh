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
command -v go >/dev/null 2>&1 || { echo "ferretdb build: go not found in PATH" >&2; exit 1; }
mkdir -p "$here/bin"
cd "$here"
echo "ferretdb build: building $bin (first time takes minutes)" >&2
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" .
mv "$bin.tmp" "$bin"
