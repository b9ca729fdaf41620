#!/usr/bin/env bash
# What a build or an install for a major relaybus does not support gets: one
# clear line and a non-zero exit, and nothing half-installed (docs/versions.md).
#   - PG=14 / PG=20: scripts/pg-config.sh (which make, make test, make demo and
#     install-deps.sh ask) refuses, naming the supported majors;
#   - a pg_config of PostgreSQL 14 (PG_CONFIG=...): make stops with one line
#     naming the supported majors, before compiling anything;
#   - PG=NN for a supported major this Debian release does not carry:
#     install-deps.sh says so and installs nothing (dpkg's list is unchanged).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SUPPORTED="15, 16, 17, 18 and 19"
TMP=$(mktemp -d /tmp/relaybus-majors.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

for m in 14 20; do
    out=$(PG=$m PG_CONFIG= bash "$RELAYBUS_ROOT/scripts/pg-config.sh" 2>&1)
    rc=$?
    check_eq "PG=$m: pg-config.sh exits 2" 2 "$rc"
    check "PG=$m: one line naming the supported majors" \
        grep -qx "pg-config.sh: PostgreSQL $m is not supported: relaybus supports PostgreSQL 15 16 17 18 19" <<<"$out"
    out=$(PG=$m PG_CONFIG= bash "$RELAYBUS_ROOT/scripts/install-deps.sh" 2>&1)
    rc=$?
    check "PG=$m: install-deps.sh exits non-zero before installing anything" \
        test "$rc" -ne 0 -a -z "$(grep 'installing' <<<"$out")"
done

# A pg_config that reports PostgreSQL 14 and otherwise answers as the real one
# (so that PGXS is found and only the version is wrong).
real=$PG_CONFIG
cat >"$TMP/pg_config" <<EOF
#!/bin/sh
if [ "\$1" = --version ]; then echo "PostgreSQL 14.13"; else exec "$real" "\$@"; fi
EOF
chmod +x "$TMP/pg_config"
mkdir -p "$TMP/src"
(cd "$RELAYBUS_ROOT" && tar --exclude='*.o' --exclude='*.d' --exclude='*.so' \
    -cf - Makefile relaybus.control sql src scripts) | tar -xf - -C "$TMP/src"
out=$(make -C "$TMP/src" PG_CONFIG="$TMP/pg_config" 2>&1)
rc=$?
check "make against PostgreSQL 14 exits non-zero" test "$rc" -ne 0
check "with one error line naming the supported majors" \
    grep -q "\*\*\* relaybus supports PostgreSQL $SUPPORTED; $TMP/pg_config is PostgreSQL 14.13\.  Stop\." <<<"$out"
check_eq "and compiles nothing" 0 "$(find "$TMP/src" -name '*.o' | wc -l)"

# A supported major this release has no package of.
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
case "$codename" in
    bookworm) absent=18 ;;
    trixie | sid | forky) absent=15 ;;
    *) absent= ;;
esac
if [[ -n "$absent" ]] && ((EUID == 0)); then
    before=$(dpkg-query -W -f='${Package} ${Version}\n' | md5sum)
    out=$(PG=$absent PG_CONFIG= RELAYBUS_DEPS=server bash "$RELAYBUS_ROOT/scripts/install-deps.sh" 2>&1)
    rc=$?
    check_eq "PG=$absent on Debian $codename: install-deps.sh exits 1" 1 "$rc"
    check "PG=$absent on Debian $codename: it says the release has no such package" \
        grep -q "install-deps: PostgreSQL $absent cannot be installed here: Debian $codename has no package postgresql-$absent" <<<"$out"
    check_eq "PG=$absent on Debian $codename: no package was installed or changed" \
        "$before" "$(dpkg-query -W -f='${Package} ${Version}\n' | md5sum)"
else
    fail "this test runs as root on Debian 12, 13 or sid (here: ${codename:-unknown}, uid $EUID)"
fi
finish
