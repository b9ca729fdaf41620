#!/usr/bin/env bash
# A relaybus library built for one major is refused by a server of another, by
# PostgreSQL itself: on LOAD (an error naming the library) and in
# shared_preload_libraries (the server does not start). relaybus adds nothing of
# its own here; this checks that the refusal happens. Which check refuses it
# depends on the pair: the dynamic loader first, when the library needs a symbol
# the server no longer has (15's relaybus.so on 16: pg_database_ownercheck,
# replaced by object_ownercheck), else the magic block ("incompatible library:
# version mismatch", naming both majors). Either is PostgreSQL's refusal before
# any of the library's code runs; the test says which happened.
#
#   test/magic_block.sh BUILT_FOR SERVER     e.g. 15 16 (both majors installed:
#                                           scripts/pg-config.sh finds each)
# Ends with "N passed, N failed". Run by the 16 lane of test/matrix.sh.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
(($# == 2)) || { echo "usage: $0 BUILT_FOR SERVER" >&2; exit 2; }
built_for=$1
server=$2
old_config=$(PG=$built_for PG_CONFIG= bash "$ROOT/scripts/pg-config.sh") || exit 2
new_config=$(PG=$server PG_CONFIG= bash "$ROOT/scripts/pg-config.sh") || exit 2

PASSED=0
FAILED=0
check() {  # check NAME CMD...
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        PASSED=$((PASSED + 1)); echo "ok - $name"
    else
        FAILED=$((FAILED + 1)); echo "FAIL - $name"; printf '    %s\n' "$out" | head -n 20
    fi
}

TMP=$(mktemp -d /tmp/relaybus-magic.XXXXXX)
chmod a+rx "$TMP"
cleanup() {
    PG_CONFIG=$new_config bash "$ROOT/test/cluster.sh" destroy "$TMP/cluster" >/dev/null 2>&1
    rm -rf "$TMP"
}
trap cleanup EXIT

echo "# building relaybus for PostgreSQL $built_for ($old_config)"
mkdir -p "$TMP/src"
# What the extension's build reads, without build products (the tree may be a
# lane's copy, with no .git).
(cd "$ROOT" && tar --exclude='*.o' --exclude='*.d' --exclude='*.so' --exclude='*.bc' \
    -cf - Makefile relaybus.control sql src scripts) | tar -xf - -C "$TMP/src"
if ! make -s -C "$TMP/src" -j"$(nproc)" PG_CONFIG="$old_config" >"$TMP/build.log" 2>&1; then
    tail -n 20 "$TMP/build.log"
    echo "0 passed, 1 failed"
    exit 1
fi
lib=$TMP/lib/relaybus.so
mkdir -p "$TMP/lib"
cp "$TMP/src/relaybus.so" "$lib"
chmod -R a+rX "$TMP/lib"
check "the library was built for PostgreSQL $built_for" test -s "$lib"

export PG_CONFIG=$new_config
RELAYBUS_PRELOAD= bash "$ROOT/test/cluster.sh" start "$TMP/cluster" >/dev/null ||
    { echo "could not start a PostgreSQL $server cluster"; echo "$PASSED passed, $((FAILED + 1)) failed"; exit 1; }
# shellcheck disable=SC1091
source "$TMP/cluster/env"
out=$("$("$PG_CONFIG" --bindir)/psql" -X -q -v VERBOSITY=verbose -d postgres -c "LOAD '$lib'" 2>&1)
rc=$?
echo "# LOAD on $server: exit $rc: $out"
check "LOAD of the $built_for library on $server fails" test "$rc" -ne 0
refused() {  # refused TEXT: one of PostgreSQL's two refusals of $lib
    grep -qE "could not load library \"$lib\": $lib: undefined symbol: |incompatible library \"$lib\": version mismatch" <<<"$1" ||
        return 1
    if grep -q "version mismatch" <<<"$1"; then
        grep -q "Server is version $server, library is version $built_for" <<<"$1"
    fi
}
check "PostgreSQL refuses it before any of its code runs (undefined symbol, or the magic block naming both majors)" \
    refused "$out"
bash "$ROOT/test/cluster.sh" stop "$TMP/cluster" >/dev/null

# In shared_preload_libraries the server refuses to start.
echo "shared_preload_libraries = '$lib'" >>"$TMP/cluster/data/postgresql.conf"
: >"$TMP/cluster/log/postgresql.log"
RELAYBUS_START_TIMEOUT=20 bash "$ROOT/test/cluster.sh" start "$TMP/cluster" >"$TMP/start.log" 2>&1
rc=$?
check "a $server server preloading the $built_for library does not start" test "$rc" -ne 0
check "its log says why (the same refusal)" refused "$(cat "$TMP/cluster/log/postgresql.log")"
echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
