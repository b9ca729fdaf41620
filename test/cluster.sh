#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests, demos and crash tests.
#
#   test/cluster.sh start DIR              initdb (first time) + start; writes DIR/env
#   test/cluster.sh init DIR               initdb only (a template for clone; never started)
#   test/cluster.sh clone TEMPLATE DIR     copy TEMPLATE's stopped data directory, give it
#                                          its own port and socket directory, start it
#   test/cluster.sh stop DIR               fast shutdown (falls back to immediate, then SIGKILL)
#   test/cluster.sh stop-immediate DIR     immediate shutdown (a crash: recovery on next start)
#   test/cluster.sh restart DIR            fast stop + start
#   test/cluster.sh restart-immediate DIR  immediate stop + start (crash recovery)
#   test/cluster.sh status DIR             exit 0 if running
#   test/cluster.sh destroy DIR            stop and remove DIR
#
# Layout: DIR/data (PGDATA), DIR/log/postgresql.log (server log), DIR (unix
# socket directory), DIR/env (`source DIR/env` sets PGHOST PGPORT PGUSER PGDATABASE).
#
# Environment:
#   RELAYBUS_PRELOAD        shared_preload_libraries (default relaybus,pg_stat_statements;
#                           set it empty for none)
#   RELAYBUS_EXTRA_CONF     extra postgresql.conf lines, appended at initdb time
#   RELAYBUS_INITDB_OPTS    extra initdb options (space separated), e.g.
#                           --no-data-checksums (18's initdb enables checksums, and
#                           pg_upgrade needs the same setting on both sides)
#   RELAYBUS_START_TIMEOUT  seconds to wait for startup / crash recovery (default 120)
#   RELAYBUS_STOP_TIMEOUT   seconds to wait for a fast shutdown (default 60)
#   PG_CONFIG               pg_config to take the binaries from
#                           (default: scripts/pg-config.sh, the major PG=NN names or this Debian release installs)
#
# initdb and postgres refuse to run as root: as root they run as user postgres
# (runuser) and DIR is chowned to it; as any other user they run as that user.
set -euo pipefail

usage() {
    echo "usage: $0 {start|init|stop|stop-immediate|restart|restart-immediate|status|destroy} DIR" >&2
    echo "       $0 clone TEMPLATE DIR" >&2
    exit 2
}

template=
if [[ "${1:-}" == clone ]]; then
    (($# == 3)) || usage
    template=$2
    set -- clone "$3"
fi
(($# == 2)) || usage
cmd=$1
dir=$2

PG_CONFIG=${PG_CONFIG:-$(bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/pg-config.sh")}
BINDIR=$("$PG_CONFIG" --bindir)
PRELOAD=${RELAYBUS_PRELOAD-relaybus,pg_stat_statements}
START_TIMEOUT=${RELAYBUS_START_TIMEOUT:-120}
STOP_TIMEOUT=${RELAYBUS_STOP_TIMEOUT:-60}
MARKER=.relaybus-test-cluster

die() { echo "cluster.sh: $*" >&2; exit 1; }

if [[ "$cmd" == start || "$cmd" == init || "$cmd" == clone ]]; then
    mkdir -p "$dir"
elif [[ ! -d "$dir" ]]; then
    [[ "$cmd" == destroy || "$cmd" == stop || "$cmd" == stop-immediate ]] && exit 0
    [[ "$cmd" == status ]] && { echo "no cluster in $dir"; exit 3; }
    die "no such directory: $dir"
fi
dir=$(cd "$dir" && pwd -P)
case "$dir" in
    *[!A-Za-z0-9._/+-]*) die "DIR must be a plain path (letters, digits, . _ / + -): $dir" ;;
esac
# A unix socket path is at most 107 bytes: DIR/.s.PGSQL.NNNNN
((${#dir} <= 90)) || die "DIR path too long for a unix socket (max 90 bytes): $dir"

data=$dir/data
log=$dir/log/postgresql.log

# Run a command as the cluster owner, with DIR as working directory (the
# caller's cwd, e.g. /root, may not be readable by postgres).
as_owner() {
    if ((EUID == 0)); then
        (cd "$dir" && runuser -u postgres -- "$@")
    else
        (cd "$dir" && "$@")
    fi
}

is_running() {
    [[ -f "$data/PG_VERSION" ]] || return 1
    as_owner "$BINDIR/pg_ctl" -D "$data" status >/dev/null 2>&1
}

cluster_port() {
    sed -n 's/^port = \([0-9][0-9]*\)$/\1/p' "$data/postgresql.conf" | tail -n 1
}

free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 "$(dirname "${BASH_SOURCE[0]}")/../scripts/free-port.py"
        return
    fi
    local p
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 20000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    die "no free port found"
}

show_log() {
    echo "---- tail of $log ----" >&2
    tail -n "${1:-60}" "$log" >&2 2>/dev/null || echo "(no server log)" >&2
    echo "----" >&2
}

write_env() {
    local port
    port=$(cluster_port)
    {
        printf 'export PGHOST=%q PGPORT=%q PGUSER=postgres PGDATABASE=postgres\n' "$dir" "$port"
        printf 'export RELAYBUS_CLUSTER_DIR=%q\n' "$dir"
    } >"$dir/env"
    chmod 644 "$dir/env"
}

do_initdb() {
    local port
    local opts=()
    [[ -n "${RELAYBUS_INITDB_OPTS:-}" ]] && read -r -a opts <<<"$RELAYBUS_INITDB_OPTS"
    as_owner "$BINDIR/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C \
        --no-sync "${opts[@]}" >"$dir/log/initdb.log" 2>&1 || {
        cat "$dir/log/initdb.log" >&2
        die "initdb failed"
    }
    port=$(free_port)
    cat >>"$data/postgresql.conf" <<EOF

# ---- relaybus test cluster (test/cluster.sh) ----
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
shared_preload_libraries = '$PRELOAD'
max_worker_processes = 32
max_connections = 200
max_locks_per_transaction = 128
fsync = on
logging_collector = off
log_line_prefix = '%m [%p] %q%a '
timezone = 'UTC'
log_timezone = 'UTC'
EOF
    if [[ -n "${RELAYBUS_EXTRA_CONF:-}" ]]; then
        printf '%s\n' "$RELAYBUS_EXTRA_CONF" >>"$data/postgresql.conf"
    fi
}

wait_ready() {
    local port i
    port=$(cluster_port)
    for ((i = 0; i < START_TIMEOUT * 4; i++)); do
        if "$BINDIR/pg_isready" -q -h "$dir" -p "$port" -U postgres -d postgres -t 1; then
            return 0
        fi
        is_running || return 1
        sleep 0.25
    done
    return 1
}

do_start() {
    local fresh=$1 try
    if is_running; then
        write_env
        echo "cluster already running: $dir (port $(cluster_port))"
        return 0
    fi
    for try in 1 2 3; do
        if as_owner "$BINDIR/pg_ctl" -D "$data" -l "$log" -w -t "$START_TIMEOUT" -s start \
                && wait_ready; then
            write_env
            echo "cluster started: $dir (port $(cluster_port))"
            return 0
        fi
        # The port we picked may have been taken in the meantime: pick another.
        if [[ "$fresh" == yes ]] && ((try < 3)) \
                && grep -q 'could not bind\|could not create any TCP/IP sockets' "$log" 2>/dev/null; then
            kill_strays
            sed -i "s/^port = [0-9][0-9]*\$/port = $(free_port)/" "$data/postgresql.conf"
            echo "cluster.sh: port in use, retrying with port $(cluster_port)" >&2
            continue
        fi
        break
    done
    show_log 80
    kill_strays
    die "could not start the cluster in $dir"
}

# Every postgres process of this cluster: its binary is $BINDIR/postgres and its
# working directory is the data directory (the postmaster chdirs there and its
# children inherit it; that holds even after they were orphaned).
cluster_pids() {
    local p exe cwd want_exe want_cwd
    want_exe=$(readlink -f "$BINDIR/postgres")
    want_cwd=$(readlink -f "$data" 2>/dev/null) || return 0
    for p in /proc/[0-9]*; do
        exe=$(readlink "$p/exe" 2>/dev/null) || continue
        [[ "$exe" == "$want_exe" ]] || continue
        cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
        [[ "$cwd" == "$want_cwd" ]] && echo "${p#/proc/}"
    done
    return 0
}

kill_strays() {
    local pids i
    pids=$(cluster_pids)
    [[ -z "$pids" ]] && return 0
    echo "cluster.sh: killing leftover postgres processes: $(echo "$pids" | tr '\n' ' ')" >&2
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        [[ -z "$(cluster_pids)" ]] && break
        sleep 0.1
    done
    [[ -z "$(cluster_pids)" ]] || die "postgres processes survived SIGKILL: $(cluster_pids | tr '\n' ' ')"
    rm -f "$data/postmaster.pid"
}

do_stop() {
    local mode=$1
    [[ -f "$data/PG_VERSION" ]] || return 0
    if is_running; then
        if [[ "$mode" == fast ]]; then
            as_owner "$BINDIR/pg_ctl" -D "$data" -m fast -w -t "$STOP_TIMEOUT" -s stop || {
                echo "cluster.sh: fast shutdown failed, trying immediate" >&2
                show_log 30
                as_owner "$BINDIR/pg_ctl" -D "$data" -m immediate -w -t 10 -s stop || true
            }
        else
            as_owner "$BINDIR/pg_ctl" -D "$data" -m immediate -w -t 10 -s stop || true
        fi
    fi
    kill_strays
}

# A copy of an initdb'ed data directory costs a fraction of initdb, which is
# what lets every integration script have its own cluster: only the lines that
# make a cluster distinct (port, socket directory) are rewritten, appended
# last so that they win over the template's.
do_clone() {
    local src
    src=$(cd "$template" && pwd -P)/data
    [[ -f "$src/PG_VERSION" && ! -f "$src/postmaster.pid" ]] \
        || die "clone: $template is not a stopped test cluster (test/cluster.sh init)"
    [[ ! -e "$data" ]] || die "clone: $data exists"
    cp -a "$src" "$data"
    rm -f "$data/postmaster.opts"
    printf "port = %s\nunix_socket_directories = '%s'\n" "$(free_port)" "$dir" >>"$data/postgresql.conf"
}

prepare_dir() {
    touch "$dir/$MARKER"
    mkdir -p "$dir/log"
    if ((EUID == 0)); then
        id postgres >/dev/null 2>&1 || die "user postgres does not exist (run scripts/install-deps.sh)"
        chown postgres:postgres "$dir" "$dir/log"
        [[ -e "$log" ]] && chown postgres:postgres "$log"
        chmod 755 "$dir"
        runuser -u postgres -- test -w "$dir" \
            || die "user postgres cannot reach $dir (a parent directory is not traversable)"
    fi
}

case "$cmd" in
    start)
        prepare_dir
        fresh=no
        if [[ ! -f "$data/PG_VERSION" ]]; then
            do_initdb
            fresh=yes
        fi
        do_start "$fresh"
        ;;
    init)
        prepare_dir
        [[ -f "$data/PG_VERSION" ]] || do_initdb
        echo "cluster initialised: $dir"
        ;;
    clone)
        prepare_dir
        do_clone
        do_start yes
        ;;
    stop)
        do_stop fast
        echo "cluster stopped: $dir"
        ;;
    stop-immediate)
        do_stop immediate
        echo "cluster stopped (immediate): $dir"
        ;;
    restart)
        do_stop fast
        do_start no
        ;;
    restart-immediate)
        do_stop immediate
        do_start no
        ;;
    status)
        if is_running; then
            echo "running: $dir (port $(cluster_port))"
        else
            echo "not running: $dir"
            exit 3
        fi
        ;;
    destroy)
        [[ -f "$dir/$MARKER" || -z "$(ls -A "$dir")" ]] \
            || die "refusing to remove $dir: not a test cluster directory"
        do_stop immediate
        rm -rf "$dir"
        echo "cluster destroyed: $dir"
        ;;
    *)
        usage
        ;;
esac
