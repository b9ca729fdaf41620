#!/usr/bin/env bash
# Builds the managed SQL edition's install script (docs/managed.md) from the
# one SQL source: each section of SRC between "-- @managed begin NAME" and
# "-- @managed end NAME" is replaced by DIR/NAME.sql; the rest is copied as is.
#
#   scripts/managed-sql.sh SRC DIR OUT VERSION
#
# VERSION replaces every @RELAYBUS_VERSION@ (relay._managed_version()).
#
# Refuses (exit 1, nothing written) an unpaired or nested marker, a section
# without its file, a file no section names, and a result that still names
# the library, so that a C-only object cannot slip into the managed script.
set -euo pipefail
(($# == 4)) || { echo "usage: $0 SRC DIR OUT VERSION" >&2; exit 2; }
src=$1 dir=$2 out=$3 version=$4
tmp=$(mktemp "${out}.XXXXXX")
trap 'rm -f "$tmp"' EXIT

awk -v dir="$dir" -v version="$version" '
    function fail(msg) { print FILENAME ":" FNR ": " msg > "/dev/stderr"; bad = 1; exit 1 }
    /^-- @managed begin / {
        if (open != "") fail("section " $4 " begins inside section " open)
        open = $4; file = dir "/" open ".sql"
        if ((getline line < file) < 0) fail("no " file " for section " open)
        do { gsub(/@RELAYBUS_VERSION@/, version, line); print line } while ((getline line < file) > 0)
        close(file); used[open] = 1
        next
    }
    /^-- @managed end / {
        if ($4 != open) fail("end of section " $4 " but " (open == "" ? "no section" : "section " open) " is open")
        open = ""; next
    }
    open == "" { print }
    END { if (!bad && open != "") { print "section " open " never ends" > "/dev/stderr"; exit 1 }
          for (s in used) print s > "/dev/fd/3" }
' "$src" >"$tmp" 3>"$tmp.used" || { rm -f "$tmp.used"; exit 1; }

for f in "$dir"/*.sql; do
    name=$(basename "$f" .sql)
    grep -qx "$name" "$tmp.used" || { echo "$f: no section of $src is named $name" >&2; rm -f "$tmp.used"; exit 1; }
done
rm -f "$tmp.used"
if grep -nE "MODULE_PATHNAME|LANGUAGE C\b|pg_extension_config_dump|CREATE EXTENSION" "$tmp" | grep -v '^[0-9]*:\s*--' >&2; then
    echo "$out: the managed script would still need the library (lines above)" >&2
    exit 1
fi
if grep -n "@RELAYBUS_VERSION@" "$tmp" >&2; then
    echo "$out: a version placeholder is left (lines above)" >&2
    exit 1
fi
chmod 644 "$tmp"
mv "$tmp" "$out"
trap - EXIT
