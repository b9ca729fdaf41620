#!/usr/bin/env bash
# Builds test/otelcol/bin/otelcol-test (the OpenTelemetry Collector with the
# otlp receiver and the contrib file exporter, core v0.161.0 / v1.67.0,
# contrib v0.161.0: main.go) once, in test/ferretdb/build.sh's way: a later
# call with the binary present and newer than main.go/go.mod/go.sum does
# nothing; the binary is cached by the hash of those three files in
# ${RELAYBUS_CACHE:-~/.cache/relaybus}/otelcol-<hash>, where a fresh clone
# copies it from. Modules come from the Go module proxy (GOPROXY default).
# The first build takes several minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/bin/otelcol-test
if [[ -x $bin && $bin -nt $here/main.go && $bin -nt $here/go.mod && $bin -nt $here/go.sum ]]; then
    exit 0
fi
hash=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
cache=${RELAYBUS_CACHE:-$HOME/.cache/relaybus}/otelcol-$hash
mkdir -p "$here/bin" "$(dirname "$cache")"
exec 9>"$cache.lock"
flock 9
if [[ -x $cache/otelcol-test ]]; then
    cp "$cache/otelcol-test" "$bin.tmp.$$"
    mv -f "$bin.tmp.$$" "$bin"
    exit 0
fi
go=
for g in "$(command -v go 2>/dev/null)" /usr/local/go/bin/go /usr/lib/go-1.2[1-9]/bin/go; do
    [[ -n "$g" && -x "$g" ]] || continue
    v=$("$g" env GOVERSION 2>/dev/null) || continue
    [[ "$(printf '%s\n' go1.21 "$v" | sort -V | head -n 1)" == go1.21 ]] && { go=$g; break; }
done
[[ -n "$go" ]] || { echo "otelcol build: no Go found (run scripts/install-deps.sh)" >&2; exit 1; }
cd "$here"
echo "otelcol build: building $bin with $go (first time takes minutes)" >&2
GOTOOLCHAIN=auto GOFLAGS=-mod=mod CGO_ENABLED=0 "$go" build -trimpath -o "$bin.tmp.$$" .
mkdir -p "$cache"
cp "$bin.tmp.$$" "$cache/otelcol-test.tmp"
mv -f "$cache/otelcol-test.tmp" "$cache/otelcol-test"
mv -f "$bin.tmp.$$" "$bin"
