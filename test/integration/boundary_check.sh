#!/usr/bin/env bash
# The C++/PostgreSQL boundary by file (docs/architecture.md) is checked on every
# build by scripts/check-boundary.sh, from the compiler's dependency lists:
#   - every file of src/pg, src/pg/cpp and src/core as it is passes;
#   - a glue file that reaches PostgreSQL's headers first other than through
#     pg/pg_includes.hpp fails;
#   - a glue file that reaches an STL container header (directly, or through a
#     C++ header of src/pg/cpp) fails, naming the file and the header;
#   - a C++ file of src/pg/cpp or a core file that reaches a PostgreSQL header
#     fails, naming the file and the header.
# No server: the lists come from g++ -M with the build's include paths.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TMP=$(mktemp -d /tmp/relaybus-boundary.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
INC=$("$PG_CONFIG" --includedir-server)
CHECK=$RELAYBUS_ROOT/scripts/check-boundary.sh

# deps SOURCE DFILE [EXTRA g++ ARGS...]: SOURCE's dependency list in DFILE.
deps() {
    local src=$1 out=$2
    shift 2
    mkdir -p "$(dirname "$out")"
    g++ -std=c++17 -M -MF "$out" -I"$RELAYBUS_ROOT/src" -I"$INC" -D_GNU_SOURCE "$@" "$RELAYBUS_ROOT/$src"
}

cd "$RELAYBUS_ROOT" || die "no $RELAYBUS_ROOT"
n=0
for f in src/pg/*.cpp src/pg/cpp/*.cpp src/core/*.cpp; do
    case $f in src/core/*) d=$TMP/all/build/core/$(basename "${f%.cpp}").d ;; *) d=$TMP/all/${f%.cpp}.d ;; esac
    deps "$f" "$d" || die "g++ -M $f failed"
    n=$((n + 1))
done
out=$(bash "$CHECK" "$INC" $(find "$TMP/all" -name '*.d') 2>&1)
check_eq "the $n files as they are pass" 0 $?
check_eq "and nothing is printed" "" "$out"

# expect_fail NAME DFILE MESSAGE: the check fails on DFILE alone, printing MESSAGE.
expect_fail() {
    local out rc
    out=$(bash "$CHECK" "$INC" "$2" 2>&1)
    rc=$?
    check_eq "$1: exit 1" 1 "$rc"
    check "$1: says so ($3)" grep -qF "$3" <<<"$out"
}

deps src/pg/extend.cpp "$TMP/a/src/pg/extend.d" -include vector
expect_fail "<vector> in a glue file" "$TMP/a/src/pg/extend.d" \
    "check-boundary: src/pg/extend.cpp is PostgreSQL glue (src/pg) but includes the STL header"
check "<vector> in a glue file: the header is named" \
    grep -q '/vector: move the C++ to src/pg/cpp' <<<"$(bash "$CHECK" "$INC" "$TMP/a/src/pg/extend.d" 2>&1)"

deps src/pg/publish_args.cpp "$TMP/b/src/pg/publish_args.d" -include pg/cpp/invoke.hpp
expect_fail "a C++ header (pg/cpp/invoke.hpp) in a glue file" "$TMP/b/src/pg/publish_args.d" \
    "src/pg/publish_args.cpp is PostgreSQL glue (src/pg) but includes the STL header"

deps src/pg/extend.cpp "$TMP/e/src/pg/extend.d" -include postgres.h
expect_fail "postgres.h before pg/pg_includes.hpp in a glue file" "$TMP/e/src/pg/extend.d" \
    "src/pg/extend.cpp reaches PostgreSQL's headers other than through pg/pg_includes.hpp"

deps src/pg/cpp/topic_check.cpp "$TMP/c/src/pg/cpp/topic_check.d" -include pg/pg_includes.hpp
expect_fail "pg/pg_includes.hpp in a C++ file" "$TMP/c/src/pg/cpp/topic_check.d" \
    "src/pg/cpp/topic_check.cpp is a C++ file (src/pg/cpp) but includes the PostgreSQL header $INC/postgres.h"

deps src/core/topic.cpp "$TMP/d/build/core/topic.d" -include postgres.h
expect_fail "postgres.h in a core file" "$TMP/d/build/core/topic.d" "(src/core) includes $INC/postgres.h"

finish
