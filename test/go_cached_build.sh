#!/usr/bin/env bash
# go_cached_build.sh DIR BINARY LABEL: builds DIR/bin/BINARY (the Go main
# package in DIR: main.go, go.mod, go.sum) once; a later call with the binary
# present and newer than those three files does nothing. The binary is cached
# by the hash of the three files in ${RELAYBUS_CACHE:-~/.cache/relaybus}/LABEL-<hash>,
# as scripts/kafka-broker.sh caches Kafka's jars: a fresh clone copies it from
# there instead of building. Modules come from the Go module proxy (GOPROXY
# default). The first build takes minutes. test/ferretdb/build.sh and
# test/otelcol/build.sh call it.
set -euo pipefail
here=$(cd "$1" && pwd)
name=$2
label=$3
bin=$here/bin/$name
if [[ -x $bin && $bin -nt $here/main.go && $bin -nt $here/go.mod && $bin -nt $here/go.sum ]]; then
    exit 0
fi
hash=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
cache=${RELAYBUS_CACHE:-$HOME/.cache/relaybus}/$label-$hash
mkdir -p "$here/bin" "$(dirname "$cache")"
# One build at a time per hash (two clones' runs side by side): the second
# waits, then finds the cache filled.
exec 9>"$cache.lock"
flock 9
if [[ -x $cache/$name ]]; then
    cp "$cache/$name" "$bin.tmp.$$"
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
[[ -n "$go" ]] || { echo "$label build: no Go found (run scripts/install-deps.sh)" >&2; exit 1; }
cd "$here"
echo "$label build: building $bin with $go (first time takes minutes)" >&2
GOTOOLCHAIN=auto GOFLAGS=-mod=mod CGO_ENABLED=0 "$go" build -trimpath -o "$bin.tmp.$$" .
mkdir -p "$cache"
cp "$bin.tmp.$$" "$cache/$name.tmp"
mv -f "$cache/$name.tmp" "$cache/$name"
mv -f "$bin.tmp.$$" "$bin"
