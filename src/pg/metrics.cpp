// The scraper's functions behind relay.handler_metrics and
// relay.handler_latency_buckets: shared-memory counters only, so a scrape
// costs the same at any backlog (docs/operations.md, Monitoring).
#include <cmath>

#include "pg/boundary.hpp"
#include "pg/pg_includes.hpp"
#include "pg/worker_state.hpp"

extern "C" {
#include "funcapi.h"
#include "utils/float.h"
#include "miscadmin.h"
PG_FUNCTION_INFO_V1(relay_handler_totals);
PG_FUNCTION_INFO_V1(relay_handler_latency_buckets);
}

using namespace relaybus::pg;

// This database's counters, copied under the lock; *n is how many.
static HandlerCounters* copy_counters(int* n) {
    auto* copy = static_cast<HandlerCounters*>(palloc(sizeof(HandlerCounters) * kMaxHandlerStats));
    *n = 0;
    if (workers == nullptr) return copy;
    LWLockAcquire(workers->lock, LW_SHARED);
    for (int i = 0; i < kMaxHandlerStats; i++)
        if (workers->handlers[i].dboid == MyDatabaseId) copy[(*n)++] = workers->handlers[i];
    LWLockRelease(workers->lock);
    return copy;
}

// relay._handler_totals(): per handler, the counters since server start that
// relay._handler_counters() lacks: published, and the latency sum (seconds).
RELAYBUS_SQL_FUNCTION(relay_handler_totals) {
    InitMaterializedSRF(fcinfo, 0);
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    int n = 0;
    HandlerCounters* c = copy_counters(&n);
    for (int i = 0; i < n; i++) {
        Datum v[3] = {Int32GetDatum(c[i].handler_id), Int64GetDatum(static_cast<int64>(c[i].published)),
                      Float8GetDatum(static_cast<double>(c[i].latency_sum_us) / 1e6)};
        bool nulls[3] = {false, false, false};
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
    }
    return (Datum)0;
}

// relay._handler_latency_buckets(): cumulative latency buckets (publish to
// completion) per handler, as a Prometheus histogram: le in seconds, powers of
// 4 from 2^10 us (1 ms) to 2^34 us (4.8 h), then +Infinity (= delivered).
// Bucket b of the counters holds latencies below 2^b us.
RELAYBUS_SQL_FUNCTION(relay_handler_latency_buckets) {
    InitMaterializedSRF(fcinfo, 0);
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    int n = 0;
    HandlerCounters* c = copy_counters(&n);
    for (int i = 0; i < n; i++) {
        uint64 below = 0;
        for (int b = 0; b < kLatencyBuckets - 1; b++) {
            below += c[i].latency[b];
            if (b < 10 || b > 34 || b % 2 != 0) continue;
            Datum v[3] = {Int32GetDatum(c[i].handler_id), Float8GetDatum(std::ldexp(1.0, b) / 1e6),
                          Int64GetDatum(static_cast<int64>(below))};
            bool nulls[3] = {false, false, false};
            tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
        }
        Datum v[3] = {Int32GetDatum(c[i].handler_id), Float8GetDatum(get_float8_infinity()),
                      Int64GetDatum(static_cast<int64>(c[i].delivered))};
        bool nulls[3] = {false, false, false};
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
    }
    return (Datum)0;
}
