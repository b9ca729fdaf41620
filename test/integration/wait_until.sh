# wait_until, the integration tests' one poll loop (sourced by lib.sh and
# mongo_lib.sh, not run).

# wait_until TIMEOUT_SECONDS CMD...: polls CMD until it exits 0: every 0.1 s
# for the first 3 s, then every 0.25 s (a long wait is one for a backlog or a
# lease, where the suites side by side need the CPU that polling would take).
wait_until() {
    local limit=$1 start now
    shift
    start=${EPOCHREALTIME//[^0-9]/}
    while :; do
        "$@" >/dev/null 2>&1 && return 0
        now=${EPOCHREALTIME//[^0-9]/}
        ((now - start > limit * 1000000)) && return 1
        if ((now - start < 3000000)); then sleep 0.1; else sleep 0.25; fi
    done
}
