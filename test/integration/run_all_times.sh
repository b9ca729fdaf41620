#!/usr/bin/env bash
# test/run_all.sh orders its jobs by their wall time in earlier runs
# ($RELAYBUS_CACHE/job-times): the file must come into being on a first run
# and keep every job's time after later ones (a shorter one as it is, a
# longer one halfway). Before the fix the first
# run's save failed under pipefail (no file yet), so no run ever had one and
# every run left a temporary file behind.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cache=$TMP/cache
times() { RELAYBUS_CACHE=$cache bash "$RELAYBUS_ROOT/test/run_all.sh" --save-job-times "$@"; }

check "a first run records its jobs' times" times build 35 integration/a 120
check_eq "job-times holds them" $'build 35\nintegration/a 120' "$(cat "$cache/job-times" 2>/dev/null)"
check "a second run records its own" times integration/a 90 integration/b 7
check_eq "the latest time of each job, and the others kept" $'build 35\nintegration/a 90\nintegration/b 7' \
    "$(cat "$cache/job-times" 2>/dev/null)"
check "a run on a loaded machine records its times" times integration/a 290 integration/b 5
check_eq "a longer time raises the recorded one by half the difference, a shorter replaces it" \
    $'build 35\nintegration/a 190\nintegration/b 5' "$(cat "$cache/job-times" 2>/dev/null)"
check_eq "no temporary file is left" "" "$(find "$cache" -name 'job-times.*')"

finish
