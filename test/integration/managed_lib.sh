# A cluster with no relaybus at all, for the managed SQL edition's scripts
# (docs/managed.md), sourced after lib.sh (not run: not executable).
#
#     bare_cluster              # a copy of the system PostgreSQL without any
#                               # relaybus file, started with nothing preloaded;
#                               # PGHOST/PGPORT point at it; sets CLUSTER,
#                               # TREE, TREE_PG_CONFIG, TREE_DIRS (its lib and
#                               # share directories), MANAGED_SCRIPT
#     managed_owner ROLE DB     # a LOGIN CREATEROLE owner (not a superuser) and its database
#     managed_install ROLE DB   # psql -1 -f the edition's script as ROLE
#     agent_database ROLE DB    # all of it for relaybus-agent: the agent, the
#                               # script and listen_client built, a bare cluster,
#                               # ROLE's DB with the edition, the login agent_login
#                               # (relay_agent); stops the script if one fails
#
# stop_bare_cluster destroys the cluster (put it into the EXIT trap);
# managed_traps sets the EXIT and INT/TERM traps that do, for a script with
# nothing else to stop.

MANAGED_VERSION=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$RELAYBUS_ROOT/relaybus.control")
MANAGED_SCRIPT=$RELAYBUS_ROOT/build/relaybus-managed--$MANAGED_VERSION.sql

stop_bare_cluster() {
    [[ -n "${CLUSTER:-}" && -d "$CLUSTER" ]] &&
        PG_CONFIG=$TREE_PG_CONFIG bash "$RELAYBUS_ROOT/test/cluster.sh" destroy "$CLUSTER" >/dev/null 2>&1
}

# PostgreSQL's binaries are relocatable (scripts/pg-tree.sh): a copy of the
# system's lib and share directories, every relaybus file left out.
bare_cluster() {
    local sys_pg_config=$PG_CONFIG libdir sharedir
    libdir=$(dirname "$("$sys_pg_config" --bindir)")
    sharedir=$("$sys_pg_config" --sharedir)
    TREE=$TMP/pg
    CLUSTER=$TMP/cluster
    mkdir -p "$TREE$libdir" "$TREE$sharedir"
    (cd "$libdir" && tar cf - --exclude='relaybus*' .) | (cd "$TREE$libdir" && tar xf -) || return 1
    (cd "$sharedir" && tar cf - --exclude='relaybus*' .) | (cd "$TREE$sharedir" && tar xf -) || return 1
    # Libraries the binaries find by a path relative to themselves (the PyPI
    # wheel of PostgreSQL 16 keeps its libpq beside its install) come along.
    local bindir rpath dep
    bindir=$("$sys_pg_config" --bindir)
    for rpath in $(for b in "$bindir"/*; do readelf -d "$b" 2>/dev/null; done |
                     sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]/\1/p' | tr ':' '\n' | sort -u); do
        [[ $rpath == '$ORIGIN'/* ]] || continue
        dep=$(realpath -m "$bindir/${rpath#\$ORIGIN/}")
        [[ -d $dep && $dep != "$libdir"/* ]] || continue
        mkdir -p "$TREE$dep"
        (cd "$dep" && tar cf - .) | (cd "$TREE$dep" && tar xf -) || return 1
    done
    chmod -R a+rX "$TMP"
    TREE_PG_CONFIG=$TREE$libdir/bin/pg_config
    TREE_DIRS=("$TREE$libdir" "$TREE$sharedir")
    RELAYBUS_PRELOAD='' PG_CONFIG=$TREE_PG_CONFIG bash "$RELAYBUS_ROOT/test/cluster.sh" start "$CLUSTER" >/dev/null ||
        return 1
    # shellcheck disable=SC1091
    source "$CLUSTER/env"
    follow_server_log
    PATH="$TREE$libdir/bin:$PATH"
}

managed_owner() {
    psql_q -U postgres -d postgres -c "CREATE ROLE $1 LOGIN CREATEROLE" -c "CREATE DATABASE $2 OWNER $1" >/dev/null
}

managed_install() {
    psql -X -q -1 -v ON_ERROR_STOP=1 -U "$1" -d "$2" -f "$MANAGED_SCRIPT" </dev/null
}

agent_database() {
    make -s -C "$RELAYBUS_ROOT" agent >/dev/null || die "make agent failed"
    make -s -C "$RELAYBUS_ROOT" managed >/dev/null || die "make managed failed"
    build_client || die "could not build listen_client"
    bare_cluster || die "the cluster without relaybus did not start"
    managed_owner "$1" "$2" || die "could not create the owner"
    local out
    out=$(managed_install "$1" "$2" 2>&1) || die "install failed: $out"
    psql_q -U postgres -d postgres -c "CREATE ROLE agent_login LOGIN IN ROLE relay_agent" >/dev/null ||
        die "could not create agent_login"
}

managed_traps() {
    trap 'stop_bare_cluster; cleanup' EXIT
    trap 'stop_bare_cluster; cleanup; echo "$TEST_NAME: interrupted"; echo "$PASSED passed, $((FAILED + 1)) failed"; exit 1' INT TERM
}
