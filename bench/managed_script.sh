# Sourced by the benches of the managed edition, from the repository root:
# sets script to the edition's SQL, MANAGED_SQL=FILE if given (an A/B of two
# versions of the SQL on one agent build), else this checkout's (make managed).
if [[ -n "${MANAGED_SQL:-}" ]]; then
    script=$MANAGED_SQL
else
    make -s managed >/dev/null
    # The install script (build/ holds the upgrade scripts too).
    script=build/relaybus-managed--$(sed -n "s/^default_version = '\(.*\)'/\1/p" relaybus.control).sql
fi
