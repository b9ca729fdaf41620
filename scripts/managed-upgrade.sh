#!/usr/bin/env bash
# Builds an upgrade script of the managed SQL edition (docs/managed.md,
# "Upgrades") from what the extension already has:
#
#   scripts/managed-upgrade.sh FROM TO INSTALL OUT EXT_UPGRADE...
#
# INSTALL is the edition's install script of TO (scripts/managed-sql.sh);
# EXT_UPGRADE are the extension's upgrade scripts from FROM to TO, in order.
# The result is
#   1. a check that this database holds the managed edition at FROM;
#   2. the state changes of EXT_UPGRADE: its DROPs (IF EXISTS: an object of the
#      library may have no counterpart here), ALTER TABLE/SEQUENCE, CREATE
#      TABLE/SEQUENCE/INDEX and data changes, in order; its definitions of
#      functions, views, triggers, privileges and comments are left out, since
#   3. every definition of INSTALL follows, as CREATE OR REPLACE (keeping each
#      object's oid, privileges and dependants), with INSTALL's schema, tables,
#      sequences and indexes left out (they exist);
#   4. a drop of every function of schema relay that 3 did not define (an
#      older signature: 3 lists what it defines, by name and argument types;
#      a signature that does not resolve stops the upgrade); the recorded
#      version is TO's relay._managed_version().
# A statement of a kind not named here stops the build (exit 1, nothing
# written), so that each new kind is decided on, not guessed.
set -euo pipefail
(($# >= 5)) || { echo "usage: $0 FROM TO INSTALL OUT EXT_UPGRADE..." >&2; exit 2; }
from=$1 to=$2 install=$3 out=$4
shift 4
tmp=$(mktemp "${out}.XXXXXX")
trap 'rm -f "$tmp"' EXIT

# split_statements MODE FILE...: prints FILE's top-level statements as MODE
# wants them. A statement starts at column 0 outside a statement and ends with
# a line ending in ";" outside any dollar quote; comment and blank lines
# between statements are copied.
split_statements() {
    awk -v mode="$1" '
        function fail(msg) { print FILENAME ":" start ": " msg > "/dev/stderr"; bad = 1; exit 1 }
        # Toggles the dollar quote state for every $tag$ on the line.
        function scan_quotes(line,    rest, tag) {
            rest = line
            while (match(rest, /\$([A-Za-z_][A-Za-z_0-9]*)?\$/)) {
                tag = substr(rest, RSTART, RLENGTH)
                if (quote == "") quote = tag; else if (quote == tag) quote = ""
                rest = substr(rest, RSTART + RLENGTH)
            }
        }
        # "relay.name(type, ...)" of a CREATE FUNCTION: its input argument
        # types, without names, defaults and OUT arguments.
        function identity(text,    head, i, c, depth, q, arg, args, n, out, w, k, t) {
            head = text
            sub(/^CREATE (OR REPLACE )?FUNCTION /, "", head)
            i = index(head, "(")
            out = substr(head, 1, i - 1) "("
            depth = 1; q = 0; arg = ""; n = 0
            for (i = i + 1; i <= length(head) && depth > 0; i++) {
                c = substr(head, i, 1)
                if (c == "\047") q = !q
                if (!q && c == "(") depth++
                if (!q && c == ")") depth--
                if (!q && (c == "," && depth == 1 || depth == 0)) { args[++n] = arg; arg = ""; continue }
                arg = arg c
            }
            k = 0
            for (i = 1; i <= n; i++) {
                t = args[i]
                gsub(/[ \t\n]+/, " ", t); sub(/^ /, "", t); sub(/ $/, "", t)
                if (t == "") continue
                sub(/ (DEFAULT|=) .*$/, "", t)
                if (t ~ /^OUT /) continue
                sub(/^(IN|INOUT|VARIADIC) /, "", t)
                # "name type" or "type": the name is a first word that is not
                # the start of a type.
                w = t; sub(/ .*/, "", w)
                if (t ~ / / && w !~ /^(double|timestamp|character|bit|time|interval)$/) sub(/^[^ ]+ /, "", t)
                out = out (k++ ? ", " : "") t
            }
            return out ")"
        }
        function kind_of(line,    w) {
            w = line
            sub(/^CREATE OR REPLACE /, "CREATE ", w)
            sub(/^CREATE UNLOGGED TABLE/, "CREATE TABLE", w)
            sub(/^CREATE UNIQUE INDEX/, "CREATE INDEX", w)
            if (w ~ /^CREATE (FUNCTION|VIEW|TRIGGER|TABLE|SEQUENCE|INDEX|SCHEMA) /) { split(w, p, " "); return p[1] " " p[2] }
            if (w ~ /^ALTER (TABLE|SEQUENCE|EXTENSION) /) { split(w, p, " "); return p[1] " " p[2] }
            if (w ~ /^(DROP|GRANT|REVOKE|COMMENT|DO|SELECT|UPDATE|INSERT|DELETE)[ ;]/) { split(w, p, /[ ;]/); return p[1] }
            if (w ~ /^\\echo /) return "echo"
            return ""
        }
        # What becomes of a statement: "keep", "skip", "replace" (CREATE OR
        # REPLACE), "drop" (DROP ... IF EXISTS); "" is refused.
        function decide(kind) {
            if (mode == "install") {
                if (kind ~ /^CREATE (FUNCTION|VIEW|TRIGGER)$/) return "replace"
                if (kind ~ /^CREATE (SCHEMA|TABLE|SEQUENCE|INDEX)$/) return "skip"
                if (kind ~ /^(DO|GRANT|REVOKE|COMMENT)$/) return "keep"
                return ""
            }
            if (kind == "DROP") return "drop"
            if (kind ~ /^(ALTER TABLE|ALTER SEQUENCE|CREATE TABLE|CREATE SEQUENCE|CREATE INDEX|UPDATE|INSERT|DELETE)$/) return "keep"
            if (kind ~ /^(CREATE FUNCTION|CREATE VIEW|CREATE TRIGGER|GRANT|REVOKE|COMMENT|ALTER EXTENSION|echo)$/) return "skip"
            # pg_extension_config_dump: a plain table is dumped whole.
            if (kind == "SELECT") return "select"
            return ""
        }
        function emit(    text) {
            text = stmt
            if (what == "select") {
                if (text !~ /^SELECT pg_catalog\.pg_extension_config_dump\(/) fail("a SELECT in an upgrade script: decide what the managed edition does with it")
                return
            }
            if (what == "skip") return
            if (what == "replace" && kind == "CREATE FUNCTION" && text ~ /^CREATE (OR REPLACE )?FUNCTION relay\./)
                sigs[++nsigs] = identity(text)
            if (what == "replace") sub(/^CREATE (OR REPLACE )?/, "CREATE OR REPLACE ", text)
            if (what == "drop") {
                if (text !~ /^DROP (FUNCTION|VIEW|TABLE|INDEX|SEQUENCE|TRIGGER) /) fail("an unexpected DROP")
                if (text !~ /^DROP [A-Z]+ IF EXISTS /) sub(/^DROP [A-Z]+ /, "&IF EXISTS ", text)
            }
            printf "%s", text
        }
        FNR == 1 && stmt != "" { fail("a statement without its end") }
        {
            line = $0
            if (stmt == "") {
                if (line ~ /^[ \t]*(--.*)?$/) { if (mode == "install") print line; next }
                if (line ~ /^[ \t]/) { start = FNR; fail("a statement that does not start at column 0") }
                start = FNR
                kind = kind_of(line)
                what = decide(kind)
                if (what == "") fail("a statement of a kind this script does not know: " substr(line, 1, 60))
                if (kind == "echo") next
            }
            stmt = stmt line "\n"
            scan_quotes(line)
            if (quote == "" && line ~ /;[ \t]*(--.*)?$/) { emit(); stmt = "" }
        }
        END {
            if (!bad && stmt != "") { fail("the last statement has no end") }
            if (bad || mode != "install") exit
            print ""
            print "-- ================================================================================"
            print "-- What the old version had and this one does not define: a function of schema"
            print "-- relay outside the list above (an older signature of one whose arguments changed)."
            print "-- ================================================================================"
            print "DO $leftovers$"
            print "DECLARE"
            print "    defined regprocedure[] := ARRAY["
            for (i = 1; i <= nsigs; i++) printf "        \047%s\047%s\n", sigs[i], (i < nsigs ? "," : "")
            print "    ]::text[]::regprocedure[];"
            print "    f regprocedure;"
            print "BEGIN"
            print "    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p"
            print "              WHERE p.pronamespace = \047relay\047::regnamespace AND p.oid <> ALL (defined::oid[])"
            print "    LOOP"
            print "        RAISE NOTICE \047dropping %, which this version does not define\047, f;"
            print "        EXECUTE format(\047DROP FUNCTION %s\047, f);"
            print "    END LOOP;"
            print "END"
            print "$leftovers$;"
        }
    ' "${@:2}"
}

{
    cat <<EOF
-- relaybus managed SQL edition $from -> $to (docs/managed.md, "Upgrades").
-- Run it as the role that installed the edition:
--   psql -1 -v ON_ERROR_STOP=1 -f relaybus-managed--$from--$to.sql
-- Built by scripts/managed-upgrade.sh; edit the sources, not this file.
DO \$upgrade\$
DECLARE
    installed text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'relaybus') THEN
        RAISE EXCEPTION 'the relaybus extension is installed in this database'
            USING ERRCODE = 'duplicate_object',
                  HINT = 'Upgrade the extension with ALTER EXTENSION relaybus UPDATE.';
    END IF;
    IF to_regnamespace('relay') IS NULL OR to_regclass('relay.deliveries') IS NULL THEN
        RAISE EXCEPTION 'the relaybus managed edition is not installed in this database'
            USING ERRCODE = 'undefined_object',
                  HINT = 'Install it with relaybus-managed--$to.sql.';
    END IF;
    -- 0.2.0 and 0.3.0 recorded no version; 0.3.0 added relay_claim's traceparent.
    IF to_regprocedure('relay._managed_version()') IS NULL THEN
        installed := CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                                        WHERE p.proname = 'relay_claim' AND 'traceparent' = ANY (p.proargnames))
                          THEN '0.3.0' ELSE '0.2.0' END;
    ELSE
        EXECUTE 'SELECT relay._managed_version()' INTO installed;
    END IF;
    IF installed IS DISTINCT FROM '$from' THEN
        RAISE EXCEPTION 'relaybus managed edition % is installed; this script upgrades $from to $to', installed
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Run relaybus-managed--%s--$to.sql, or nothing if %s is $to.', installed, installed);
    END IF;
END
\$upgrade\$;

-- ================================================================================
-- State: the extension's upgrade scripts' changes of tables, sequences and indexes
-- ================================================================================
EOF
    split_statements delta "$@"
    cat <<EOF

-- ================================================================================
-- Definitions: relaybus-managed--$to.sql without its schema, tables, sequences and indexes
-- ================================================================================
EOF
    split_statements install "$install"
} >"$tmp"
grep -q "relay._managed_version" "$tmp" || { echo "$install: defines no relay._managed_version()" >&2; exit 1; }
chmod 644 "$tmp"
mv "$tmp" "$out"
trap - EXIT
