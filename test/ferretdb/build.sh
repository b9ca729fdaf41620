#!/usr/bin/env bash
# Builds test/ferretdb/bin/ferretdb-test (FerretDB v1.24.2, embeddable package,
# SQLite backend) once; a later call with the binary present and newer than
# main.go/go.mod/go.sum does nothing. The binary is cached by the hash of those
# three files in ${RELAYBUS_CACHE:-~/.cache/relaybus}/ferretdb-<hash>, as
# scripts/kafka-broker.sh caches Kafka's jars: a fresh clone copies it from
# there instead of building. Modules come from the Go module proxy (GOPROXY
# default). The first build takes a few minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/bin/ferretdb-test
if [[ -x $bin && $bin -nt $here/main.go && $bin -nt $here/go.mod && $bin -nt $here/go.sum ]]; then
    exit 0
fi
hash=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
cache=${RELAYBUS_CACHE:-$HOME/.cache/relaybus}/ferretdb-$hash
mkdir -p "$here/bin" "$(dirname "$cache")"
# One build at a time per hash (two clones' runs side by side): the second
# waits, then finds the cache filled.
exec 9>"$cache.lock"
flock 9
if [[ -x $cache/ferretdb-test ]]; then
    cp "$cache/ferretdb-test" "$bin.tmp.$$"
    mv -f "$bin.tmp.$$" "$bin"
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
cd "$here"
echo "ferretdb build: building $bin with $go (first time takes minutes)" >&2
GOTOOLCHAIN=auto GOFLAGS=-mod=mod CGO_ENABLED=0 "$go" build -trimpath -o "$bin.tmp.$$" .
mkdir -p "$cache"
cp "$bin.tmp.$$" "$cache/ferretdb-test.tmp"
mv -f "$cache/ferretdb-test.tmp" "$cache/ferretdb-test"
mv -f "$bin.tmp.$$" "$bin"
