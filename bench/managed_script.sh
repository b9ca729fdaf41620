# Sourced by the benches of the managed edition, from the repository root:
# sets script to the edition's SQL, MANAGED_SQL=FILE if given (an A/B of two
# versions of the SQL on one agent build), else this checkout's (make managed).
if [[ -n "${MANAGED_SQL:-}" ]]; then
    script=$MANAGED_SQL
else
    make -s managed >/dev/null
    script=$(ls build/relaybus-managed--*.sql | head -1)
fi
