# Shared setup of the relaybus-mongo test scripts (sourced, not run): builds
# FerretDB (test/ferretdb/build.sh) and relaybus-mongo, starts FerretDB (SQLite
# backend, or PostgreSQL with RELAYBUS_FERRETDB_BACKEND=postgresql) and the
# real HTTP receiver, and defines the helpers below. The
# sourcing script sets SUITE (a log prefix) first and calls `finish` at the end.
set -uo pipefail

ROOT=${RELAYBUS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)}
INTEG=$ROOT/test/integration
export PYTHONPATH="$INTEG${PYTHONPATH:+:$PYTHONPATH}"  # mongo_deliveries.py
# libmongoc's statistics segment is /dev/shm/mongoc-<pid>, created O_EXCL and
# left behind by every kill -9 these tests do; a later sidecar that reuses such
# a pid logs a plain-text "Falling back to malloc for counters." to stderr
# (mongo.sh's JSON-log check then fails, about 1 run in 100 on a long-lived
# machine). The tests never read the segment: do not create it.
export MONGOC_DISABLE_SHM=1
BIN=${RELAYBUS_MONGO_BIN:-$ROOT/relaybus-mongo}  # another build: an A/B against an older tree
TMP=$(mktemp -d /tmp/relaybus-mongo.XXXXXX)
PY=python3
PYM=python3
$PYM -c 'import pymongo' 2>/dev/null || PYM=/usr/bin/python3
PASSED=0
FAILED=0
T0=$(date +%s%N)
PIDS=()

log() {
    local ms=$((($(date +%s%N) - T0) / 1000000))
    printf '# [%s %d.%03ds] %s\n' "${SUITE:-mongo}" $((ms / 1000)) $((ms % 1000)) "$*"
}
pass() { PASSED=$((PASSED + 1)); echo "ok - $1"; }
fail() {
    FAILED=$((FAILED + 1)); echo "FAIL - $1"; shift
    (($# > 0)) && printf '    %s\n' "$@"
    return 0
}
check_eq() { if [[ "$2" == "$3" ]]; then pass "$1"; else fail "$1" "expected: $2" "actual:   $3"; fi; }
# check_rc NAME EXPECTED_RC PATTERN CMD...: exit code and a stderr/stdout pattern.
check_rc() {
    local name=$1 want=$2 pat=$3 out rc
    shift 3
    out=$("$@" 2>&1)
    rc=$?
    if [[ $rc == "$want" ]] && grep -qE -- "$pat" <<<"$out"; then
        pass "$name"
    else
        fail "$name" "want exit $want and /$pat/, got exit $rc:" "$(head -c 600 <<<"$out")"
    fi
}
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    PIDS=()
    stop_ferretdb_pg
    [[ "${RELAYBUS_KEEP_TMP:-0}" == 1 ]] || rm -rf "$TMP"
}
finish() {
    cleanup
    trap - EXIT
    echo "$PASSED passed, $FAILED failed"
    ((FAILED == 0))
    exit $?
}
die() { fail "$*"; finish; }
trap 'cleanup' EXIT
trap 'cleanup; echo "$PASSED passed, $((FAILED + 1)) failed (interrupted)"; exit 1' INT TERM

source "$INTEG/wait_until.sh"

log "building FerretDB (once) and relaybus-mongo"
bash "$ROOT/test/ferretdb/build.sh" || die "FerretDB build failed (needs Go and the module proxy)"
make -s -C "$ROOT/src/mongo" -j"$(nproc)" >"$TMP/make.log" 2>&1 || { cat "$TMP/make.log"; die "relaybus-mongo build failed"; }

# FerretDB's backend: sqlite (a directory per server) or postgresql (a
# database per server in a throwaway cluster of this script's own, which
# needs no relaybus library: RELAYBUS_PRELOAD is empty). Unset: the sourcing
# script's MONGO_BACKEND_DEFAULT, else sqlite.
FDB_BACKEND=${RELAYBUS_FERRETDB_BACKEND:-${MONGO_BACKEND_DEFAULT:-sqlite}}
case $FDB_BACKEND in
sqlite) ;;
postgresql)
    FDB_PG=$(mktemp -d /tmp/relaybus-fdbpg.XXXXXX)
    RELAYBUS_PRELOAD='' RELAYBUS_EXTRA_CONF="${RELAYBUS_EXTRA_CONF:-}"$'\nmax_connections = 200' \
        bash "$ROOT/test/cluster.sh" start "$FDB_PG" >"$TMP/fdb_pg.log" 2>&1 ||
        { cat "$TMP/fdb_pg.log"; die "PostgreSQL for FerretDB did not start"; }
    FDB_PG_ENV=$(env -i bash -c "source '$FDB_PG/env'; echo \"\$PGHOST \$PGPORT \$PGUSER\"")
    read -r FDB_PGHOST FDB_PGPORT FDB_PGUSER <<<"$FDB_PG_ENV"
    FDB_PGBIN=$("$(bash "$ROOT/scripts/pg-config.sh")" --bindir)
    ;;
*) die "RELAYBUS_FERRETDB_BACKEND must be sqlite or postgresql, not $FDB_BACKEND" ;;
esac
stop_ferretdb_pg() {
    [[ -n "${FDB_PG:-}" ]] || return 0
    bash "$ROOT/test/cluster.sh" destroy "$FDB_PG" >/dev/null 2>&1
    FDB_PG=
}
# ferretdb_store NAME: the ferretdb-test arguments of the store named NAME (the
# same store again for the same NAME: a restarted server keeps its data).
ferretdb_store() {
    if [[ $FDB_BACKEND == sqlite ]]; then
        printf '%s\n' -dir "$TMP/$1"
        return
    fi
    "$FDB_PGBIN/psql" -h "$FDB_PGHOST" -p "$FDB_PGPORT" -U "$FDB_PGUSER" -d postgres -Atqc \
        "SELECT 1 FROM pg_database WHERE datname = '$1'" | grep -q 1 ||
        "$FDB_PGBIN/createdb" -h "$FDB_PGHOST" -p "$FDB_PGPORT" -U "$FDB_PGUSER" "$1" || return 1
    printf '%s\n' -dir "$TMP/$1" -postgresql-url "postgres://$FDB_PGUSER@127.0.0.1:$FDB_PGPORT/$1"
}
# start_ferretdb NAME: a FerretDB on a free port; sets FDB_PID and prints nothing.
start_ferretdb() {
    local store
    rm -f "$TMP/uri"
    mapfile -t store < <(ferretdb_store "$1")
    "$ROOT/test/ferretdb/bin/ferretdb-test" "${store[@]}" -uri-file "$TMP/uri" >"$TMP/$1.out" 2>"$TMP/$1.err" &
    FDB_PID=$!
    PIDS+=($FDB_PID)
    wait_until 20 test -s "$TMP/uri" || { cat "$TMP/$1.err"; die "FerretDB did not start"; }
}
start_ferretdb fdb
URI="$(cat "$TMP/uri")?serverSelectionTimeoutMS=5000"
export RELAYBUS_MONGO_URI=$URI

$PY "$INTEG/http_receiver.py" --port-file "$TMP/rport" --log "$TMP/requests.log" 2>"$TMP/receiver.err" &
PIDS+=($!)
wait_until 15 test -s "$TMP/rport" || die "HTTP receiver did not start"
RPORT=$(cat "$TMP/rport")
HOOK="http://127.0.0.1:$RPORT"
log "FerretDB ($FDB_BACKEND) at $URI, receiver on $RPORT"

control() { curl -s -o /dev/null -X POST --data "$2" "$HOOK/_control${1}"; }
count_path() { curl -s "$HOOK/_count?path=$1"; }
# has_requests PATH N: the receiver has N requests of PATH, or gets them within
# a second (it answers at the Nth: wait_until's poll ends on the request).
has_requests() { (($(curl -s --max-time 5 "$HOOK/_count?path=$1&min=$2&timeout=1") >= $2)); }
# tag_positions PATH TAG: the 1-based positions, among the requests to PATH, of
# those whose payload's tag is TAG.
tag_positions() { curl -s "$HOOK/_requests" | $PY -c "
import json,sys
rs=[json.loads(r['body']) for r in json.load(sys.stdin) if r['path']=='$1']
print(' '.join(str(i+1) for i,b in enumerate(rs) if b['payload']['tag']=='$2'))"; }
# start_instance NAME DB [settings...]: runs `relaybus-mongo run` in the background; sets IPID.
start_instance() {
    local name=$1 db=$2
    shift 2
    "$BIN" run --database "$db" --instance "$name" --lease 3s --poll-interval 50ms \
        --http-allowlist 127.0.0.1 --metrics-listen 127.0.0.1:0 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    IPID=$!
    PIDS+=($IPID)
}
# metrics_addr NAME: the bound /metrics address from the instance's start log line.
metrics_addr() { $PY -c "
import json,sys
for l in open('$TMP/$1.err'):
    try: j=json.loads(l)
    except Exception: continue
    if j.get('metrics'): print(j['metrics']); break"; }
# has_metrics_addr NAME: the instance has logged it (for wait_until, which
# re-runs its command: a "$(metrics_addr NAME)" argument would be read once).
has_metrics_addr() { [[ -n "$(metrics_addr "$1")" ]]; }
# wait_metrics_addr NAME: until the instance has logged it. The instance logs
# it as it starts, in well under a second on a quiet machine; the cap is for a
# loaded one (10 s once failed in a fresh root beside a build on both cores).
wait_metrics_addr() { wait_until 60 has_metrics_addr "$1"; }
metric() { curl -s "http://$(metrics_addr "$1")/metrics" | awk -v m="$2" '$1==m {print $2}'; }
# took_lanes_again NAME: the instance logged all 64 lanes held a second time
# (the first is at its start).
took_lanes_again() { (($(grep -c '"held":64' "$TMP/$1.err") >= 2)); }
stats_field() { "$BIN" stats --database "$1" | $PY -c "import json,sys; print(sum(h['$2'] for h in json.load(sys.stdin)))"; }
pending_is() { [[ "$(stats_field "$1" pending)" == "$2" ]]; }
# analyze ARGS...: mongo_check.py's counts of what the receiver got (see there), into R.
declare -A R
analyze() {
    local line
    R=()
    while IFS= read -r line; do R[${line%%=*}]=${line#*=}; done \
        < <($PY "$INTEG/mongo_check.py" --receiver "$RPORT" "$@")
    [[ -n "${R[requests]:-}" ]]
}
# slow_link_to NAME DELAY COMMANDS: a link to FerretDB that delays only the
# replies to COMMANDS (comma-separated) by DELAY seconds, or by the number in
# $TMP/NAME_delay once it is changed; sets SLOW_URI. $TMP/NAME_held holds the
# number of replies held back right now.
slow_link_to() {
    local fport
    fport=$($PY -c "import urllib.parse as u; print(u.urlparse('$URI').port)")
    echo "$2" >"$TMP/$1_delay"
    $PY "$INTEG/slow_link.py" --target 127.0.0.1:$fport --delay "$2" --commands "$3" --delay-file "$TMP/$1_delay" \
        --held-file "$TMP/$1_held" --port-file "$TMP/$1_port" 2>"$TMP/$1_link.err" &
    PIDS+=($!)
    wait_until 10 test -s "$TMP/$1_port" || fail "slow link $1 did not start"
    SLOW_URI="mongodb://127.0.0.1:$(cat "$TMP/$1_port")/?serverSelectionTimeoutMS=5000"
}
stop_instance() {  # PID: SIGTERM, wait; exit code in STOP_RC
    kill -TERM "$1" 2>/dev/null
    wait "$1"
    STOP_RC=$?
}
