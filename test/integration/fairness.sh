#!/usr/bin/env bash
# Fairness between handlers of one dispatcher (issue 27, item 5): while an
# http handler drains a backlog of 40,000 (concurrency 64), events published
# one by one to a quiet http handler of the same database reach their
# receiver promptly: each dispatcher iteration claims for every handler, and
# the pipeline keeps each handler's queue and concurrency apart. Checked:
# every quiet event arrives while the backlog is still draining, with p99
# (of 40) publish-to-arrival under 2 s: generous for this shared 2-core
# machine (one run with twelve suites beside it saw 1.08 s), and still far
# below the ~10 s the backlog takes to drain, which a starved quiet handler
# would wait (bench/fairness.sh measures it with a backlog of 100,000).
# Then the same beside a notify handler's backlog of 40,000 (of which about 9,000
# drain while the five quiet events go out).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"
BACKLOG=${FAIRNESS_BACKLOG:-40000}
QUIET=40

http_test_db fairness
http_handler "$db" busy "$URL/busy" '{"concurrency": 64}' 'f.busy' || die "handler busy"
http_handler "$db" quiet "$URL/quiet" '{}' 'f.quiet' || die "handler quiet"
sql "$db" "SELECT relay_pause_handler('busy')" \
    "SELECT count(relay_publish('f.busy', jsonb_build_object('i', i), 'k' || (i % 100))) FROM generate_series(1, $BACKLOG) i" \
    >/dev/null || die "the backlog"
sql "$db" "SELECT relay_resume_handler('busy')" >/dev/null
check "the busy handler drains its backlog (500 arrived)" wait_requests "$LOG" /busy 500 60
for i in $(seq 1 "$QUIET"); do
    sql "$db" "SELECT relay_publish('f.quiet', jsonb_build_object('i', $i))" >/dev/null
    sleep 0.05
done
left=$(pending_of "$db" busy)
check "the $QUIET quiet events arrive" wait_requests "$LOG" /quiet "$QUIET" 30
log "busy deliveries still pending when the last quiet one was published: $left of $BACKLOG"
check "... published while the backlog was still draining ($left pending)" test "$left" -gt 1000
py_facts f "$LOG" <<'PY'
import sys, datetime, http_log
lat = []
for r in http_log.records(sys.argv[1], "/quiet"):
    e = __import__("json").loads(r["body"])
    pub = datetime.datetime.strptime(e["published_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    lat.append((r["t"] - pub.timestamp()) * 1000)
lat.sort()
pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else -1
http_log.facts(dict(n=len(lat), p50=int(pick(0.5)), p99=int(pick(0.99)), max=int(lat[-1]) if lat else -1))
PY
log "quiet handler, publish to arrival: p50 $(r p50) ms, p99 $(r p99) ms, max $(r max) ms ($(r n) events)"
check "p99 publish-to-arrival of the quiet handler under 2 s ($(r p99) ms)" test "$(r p99)" -lt 2000

# A notify handler's backlog keeps the dispatcher busy (full batches, one
# iteration after another, no wait): the http requests it claims for the quiet
# handler meanwhile still go out, while the backlog drains.
LOUD=${FAIRNESS_NOTIFY_BACKLOG:-40000}
sql "$db" "SELECT relay_create_handler('loud', 'notify', 'loud_channel', '{}')" "SELECT relay_route('f.loud', 'loud')" \
    "SELECT relay_pause_handler('loud')" \
    "SELECT count(relay_publish('f.loud', jsonb_build_object('i', i), 'k' || (i % 100))) FROM generate_series(1, $LOUD) i" \
    >/dev/null || die "the notify backlog"
sql "$db" "SELECT relay_resume_handler('loud')" >/dev/null
for i in 1 2 3 4 5; do sql "$db" "SELECT relay_publish('f.quiet', jsonb_build_object('loud', $i))" >/dev/null; done
check "5 more quiet events arrive beside a notify handler's backlog" wait_requests "$LOG" /quiet "$((QUIET + 5))" 60
left=$(pending_of "$db" loud)
check "... while the notify backlog is still draining ($left of $LOUD pending when they had all arrived)" \
    test "$left" -gt 1000
finish
