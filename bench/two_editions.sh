# Sourced by the benches that compare the two editions (managed_publish.sh,
# agent_dispatch.sh), from the repository root: builds the managed script and
# starts two throwaway clusters of the same PostgreSQL, $ext with the relaybus
# library preloaded, $man with nothing preloaded and the script copied to
# $man/managed.sql; both are destroyed at exit, with the processes in
# BENCH_PIDS. on DIR CMD... runs CMD with DIR's cluster environment.
# MANAGED_SQL=FILE: that script of the edition (bench/managed_script.sh).
BENCH_PIDS=()
source bench/managed_script.sh
ext=$(mktemp -d /tmp/relaybus-bench-ext.XXXXXX)
man=$(mktemp -d /tmp/relaybus-bench-man.XXXXXX)
trap 'kill "${BENCH_PIDS[@]}" 2>/dev/null || true; bash test/cluster.sh destroy "$ext" >/dev/null 2>&1 || true; bash test/cluster.sh destroy "$man" >/dev/null 2>&1 || true' EXIT
conf=$'shared_buffers = 512MB\nmax_wal_size = 4GB\ncheckpoint_timeout = 30min\nsynchronous_commit = off'
RELAYBUS_PRELOAD=relaybus RELAYBUS_EXTRA_CONF="$conf" bash test/cluster.sh start "$ext" >/dev/null
RELAYBUS_PRELOAD='' RELAYBUS_EXTRA_CONF="$conf" bash test/cluster.sh start "$man" >/dev/null
cp "$script" "$man/managed.sql"
chmod 644 "$man/managed.sql"

on() {
    local d=$1
    shift
    (
        # shellcheck disable=SC1091
        source "$d/env"
        "$@"
    )
}
