// The scraper's functions behind relay.handler_metrics and
// relay.handler_latency_buckets: shared-memory counters only, so a scrape
// costs the same at any backlog (docs/operations.md, Monitoring).
#include <cmath>

#include "pg/pg_compat.hpp"
#include "pg/pg_includes.hpp"
#include "pg/worker_state.hpp"

extern "C" {
#include "access/genam.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "commands/extension.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/float.h"
#include "miscadmin.h"
PG_FUNCTION_INFO_V1(relay_handler_totals);
PG_FUNCTION_INFO_V1(relay_handler_latency_buckets);
PG_FUNCTION_INFO_V1(relay_oldest_pending);
}

using namespace relaybus::pg;

// relay._handler_totals(): per handler, the counters since server start that
// relay._handler_counters() lacks: published, the latency sum (seconds), and
// the pending count (NULL until counted: pending_counter.hpp).
extern "C" Datum relay_handler_totals(PG_FUNCTION_ARGS) {
  InitMaterializedSRF(fcinfo, 0);
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  int n = 0;
  HandlerCounters* c = copy_handler_counters(&n);
  // The pending counts hold once a dispatcher counted this installation.
  bool counted = pending_counted_for(MyDatabaseId, get_extension_oid("relaybus", true));
  for (int i = 0; i < n; i++) {
    Datum v[4] = {Int32GetDatum(c[i].handler_id), Int64GetDatum(static_cast<int64>(c[i].published)),
                  Float8GetDatum(static_cast<double>(c[i].latency_sum_us) / 1e6),
                  Int64GetDatum(Max(c[i].pending, int64{0}))};
    bool nulls[4] = {false, false, false, !counted};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
  }
  return (Datum)0;
}

// relay._handler_latency_buckets(): cumulative latency buckets (publish to
// completion) per handler, as a Prometheus histogram: le in seconds, powers of
// 4 from 2^10 us (1 ms) to 2^34 us (4.8 h), then +Infinity (= delivered).
// Bucket b of the counters holds latencies below 2^b us.
extern "C" Datum relay_handler_latency_buckets(PG_FUNCTION_ARGS) {
  InitMaterializedSRF(fcinfo, 0);
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  int n = 0;
  HandlerCounters* c = copy_handler_counters(&n);
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

// relay._oldest_pending(handler_id): publish time of the oldest pending
// delivery of the handler, or NULL: the head of each priority class (0..3) in
// the claim index (handler_id, priority, id), read directly. A query cannot
// be trusted with it: with the class as a parameter the planner may walk the
// primary key past every row of other handlers and classes (270 ms at 200k
// pending), which is the cost this view exists to avoid.
extern "C" Datum relay_oldest_pending(PG_FUNCTION_ARGS) {
  if (PG_ARGISNULL(0)) PG_RETURN_NULL();
  int32 handler_id = PG_GETARG_INT32(0);
  Oid ns = get_namespace_oid("relay", false);
  Oid heap_oid = get_relname_relid("deliveries", ns);
  Oid index_oid = get_relname_relid("deliveries_claim", ns);
  if (!OidIsValid(heap_oid) || !OidIsValid(index_oid))
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT), errmsg("relay.deliveries or its claim index is missing")));
  Relation heap = table_open(heap_oid, AccessShareLock);
  Relation index = index_open(index_oid, AccessShareLock);
  AttrNumber published_att = get_attnum(heap_oid, "published_at");
  TupleTableSlot* slot = table_slot_create(heap, nullptr);
  Snapshot snapshot = GetActiveSnapshot();
  bool found = false;
  TimestampTz oldest = 0;
  for (int16 priority = 0; priority <= 3; priority++) {
    ScanKeyData keys[2];
    ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(handler_id));
    ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT2EQ, Int16GetDatum(priority));
    IndexScanDesc scan = relaybus_index_beginscan(heap, index, snapshot, 2, 0);
    index_rescan(scan, keys, 2, nullptr, 0);
    if (index_getnext_slot(scan, ForwardScanDirection, slot)) {
      bool isnull = false;
      Datum d = slot_getattr(slot, published_att, &isnull);
      TimestampTz t = isnull ? 0 : DatumGetTimestampTz(d);
      if (!isnull && (!found || t < oldest)) oldest = t;
      found = found || !isnull;
    }
    index_endscan(scan);
    ExecClearTuple(slot);
  }
  ExecDropSingleTupleTableSlot(slot);
  index_close(index, AccessShareLock);
  table_close(heap, AccessShareLock);
  if (!found) PG_RETURN_NULL();
  PG_RETURN_TIMESTAMPTZ(oldest);
}

// relay._pending_counted(): whether relay._handler_totals().pending holds
// (a dispatcher counted this installation since the server started).
extern "C" {
PG_FUNCTION_INFO_V1(relay_pending_counted);
}
extern "C" Datum relay_pending_counted(PG_FUNCTION_ARGS) {
  PG_RETURN_BOOL(pending_counted_for(MyDatabaseId, get_extension_oid("relaybus", true)));
}
