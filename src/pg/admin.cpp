// Internal SQL functions behind the administration API: validation of handlers
// and routes (the rules live in the core), the catalog-change trigger, and the
// views' access to shared memory.

#include "core/lane_hash.hpp"
#include "pg/boundary.hpp"
#include "pg/cpp/admin_checks.h"
#include "pg/catalog_cache.hpp"
#include "pg/leases.hpp"
#include "pg/pg_includes.hpp"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"

extern "C" {
#include "utils/json.h"
PG_FUNCTION_INFO_V1(relay_validate_handler);
PG_FUNCTION_INFO_V1(relay_validate_route);
PG_FUNCTION_INFO_V1(relay_catalog_changed);
PG_FUNCTION_INFO_V1(relay_leases);
PG_FUNCTION_INFO_V1(relay_lane_of);
PG_FUNCTION_INFO_V1(relay_workers);
PG_FUNCTION_INFO_V1(relay_handler_counters);
PG_FUNCTION_INFO_V1(relay_handler_sends);
PG_FUNCTION_INFO_V1(relay_handler_limits);
}

using namespace relaybus;
using namespace relaybus::pg;

static void require_arg(FunctionCallInfo fcinfo, int n, const char* what) {
  if (PG_ARGISNULL(n)) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("%s must not be NULL", what)));
}

// relay._validate_handler(name, kind, target, options) -> {"target", "options", "secrets"}
extern "C" Datum relay_validate_handler(PG_FUNCTION_ARGS) {
  require_arg(fcinfo, 0, "name");
  require_arg(fcinfo, 1, "kind");
  int name_len = 0, kind_len = 0, target_len = 0;
  char* name = text_arg(fcinfo, 0, &name_len);
  char* kind_text = text_arg(fcinfo, 1, &kind_len);
  bool target_null = PG_ARGISNULL(2);
  char* target = target_null ? nullptr : text_arg(fcinfo, 2, &target_len);
  Jsonb* options = PG_ARGISNULL(3) ? nullptr : PG_GETARG_JSONB_P(3);
  char* options_text = options == nullptr ? pstrdup("{}") : JsonbToCString(nullptr, &options->root, VARSIZE(options));
  char* secrets_json = nullptr;
  ErrorRecord err;
  if (!check_handler(name, name_len, kind_text, kind_len, target, target_len, options_text, &secrets_json, &err))
    raise_error(&err);

  StringInfoData buf;
  initStringInfo(&buf);
  appendStringInfoString(&buf, "{\"target\": ");
  if (target_null || target_len == 0)
    appendStringInfoString(&buf, "null");
  else
    escape_json(&buf, target);
  appendStringInfoString(&buf, ", \"secrets\": ");
  appendStringInfoString(&buf, secrets_json);
  appendStringInfoString(&buf, ", \"options\": ");
  Datum public_options =
      options == nullptr ? DirectFunctionCall1(jsonb_in, CStringGetDatum("{}"))
                         : DirectFunctionCall2(jsonb_delete, JsonbPGetDatum(options), CStringGetTextDatum("secret"));
  Jsonb* po = DatumGetJsonbP(public_options);
  appendStringInfoString(&buf, JsonbToCString(nullptr, &po->root, VARSIZE(po)));
  appendStringInfoChar(&buf, '}');
  PG_RETURN_DATUM(DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data)));
}

// relay._validate_route(pattern, wire_name)
extern "C" Datum relay_validate_route(PG_FUNCTION_ARGS) {
  require_arg(fcinfo, 0, "topic");
  int len = 0, wlen = 0;
  char* pattern = text_arg(fcinfo, 0, &len);
  bool wire_null = PG_ARGISNULL(1);
  char* wire = wire_null ? nullptr : text_arg(fcinfo, 1, &wlen);
  ErrorRecord err;
  if (!check_route(pattern, len, wire, wlen, &err)) raise_error(&err);
  PG_RETURN_VOID();
}

extern "C" Datum relay_catalog_changed(PG_FUNCTION_ARGS) {
  if (!CALLED_AS_TRIGGER(fcinfo)) elog(ERROR, "relay._catalog_changed must be called as a trigger");
  catalog_changed_in_this_transaction();
  // A resumed handler, a new route or new options can make deliveries
  // ready that no publish will announce: wake the dispatchers at commit
  // (only then), as a publish does, so they reload the catalog and claim.
  wake_dispatchers_at_commit();
  return (Datum)0;
}

extern "C" Datum relay_leases(PG_FUNCTION_ARGS) {
  InitMaterializedSRF(fcinfo, 0);
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  int max = guc_max_leases;
  auto* entries = static_cast<LeaseEntry*>(palloc(sizeof(LeaseEntry) * max));
  int n = leases_copy(entries, max);
  for (int i = 0; i < n; i++) {
    Datum values[4] = {Int64GetDatum(entries[i].key.delivery_id), Int32GetDatum(entries[i].handler_id),
                       TimestampTzGetDatum(entries[i].until), Int32GetDatum(entries[i].owner_pid)};
    bool nulls[4] = {false, false, false, false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
  }
  return (Datum)0;
}

extern "C" Datum relay_lane_of(PG_FUNCTION_ARGS) {
  text* key = PG_GETARG_TEXT_PP(0);
  PG_RETURN_INT32(core::lane_for_key(std::string_view(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key))));
}

// relay._workers(): the dispatchers of this database, and a row without a pid
// when the launcher could not start one (no background worker slot free).
extern "C" Datum relay_workers(PG_FUNCTION_ARGS) {
  InitMaterializedSRF(fcinfo, 0);
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  if (workers == nullptr) return (Datum)0;
  int nslots = workers->nslots;
  auto* copy = static_cast<DispatcherSlot*>(palloc(sizeof(DispatcherSlot) * nslots));
  TimestampTz not_started_since = 0;
  LWLockAcquire(workers->lock, LW_SHARED);
  memcpy(copy, workers->slots, sizeof(DispatcherSlot) * nslots);
  int d = database_slot(MyDatabaseId, false);
  if (d >= 0) not_started_since = workers->databases[d].not_started_since;
  LWLockRelease(workers->lock);
  for (int s = 0; s < nslots; s++) {
    const DispatcherSlot& w = copy[s];
    if (w.dboid != MyDatabaseId || w.pid == 0) continue;
    Datum v[8] = {Int32GetDatum(w.pid),
                  Int32GetDatum(w.worker_index),
                  Int32GetDatum(w.lanes_held),
                  Int64GetDatum(static_cast<int64>(w.delivered)),
                  Int64GetDatum(static_cast<int64>(w.failed)),
                  CStringGetTextDatum(w.last_error),
                  TimestampTzGetDatum(w.started_at),
                  TimestampTzGetDatum(w.heartbeat)};
    bool n[8] = {false, false, false, false, false, w.last_error[0] == '\0', false, false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
  }
  if (not_started_since != 0) {
    char msg[200];
    snprintf(msg, sizeof(msg), "not started since %s: no background worker slot free (max_worker_processes)",
             timestamptz_to_str(not_started_since));
    Datum v[8] = {0, 0, Int32GetDatum(0), Int64GetDatum(0), Int64GetDatum(0), CStringGetTextDatum(msg), 0, 0};
    bool n[8] = {true, true, false, false, false, false, true, true};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
  }
  return (Datum)0;
}

// Latency percentile from a log2 histogram: the upper bound of the bucket, in ms.
static double percentile_ms(const uint64* buckets, uint64 total, double q) {
  if (total == 0) return -1;
  uint64 rank = static_cast<uint64>(q * static_cast<double>(total - 1)) + 1, seen = 0;
  for (int b = 0; b < kLatencyBuckets; b++) {
    seen += buckets[b];
    if (seen >= rank) return static_cast<double>(int64{1} << b) / 1000.0;
  }
  return static_cast<double>(int64{1} << (kLatencyBuckets - 1)) / 1000.0;
}

// relay._handler_counters(): delivered, retried and dead-lettered counts and
// latency percentiles since server start, per handler of this database.
extern "C" Datum relay_handler_counters(PG_FUNCTION_ARGS) {
  InitMaterializedSRF(fcinfo, 0);
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  int count = 0;
  const HandlerCounters* copy = copy_handler_counters(&count);
  for (int i = 0; i < count; i++) {
    const HandlerCounters& c = copy[i];
    double p50 = percentile_ms(c.latency, c.delivered, 0.50);
    double p99 = percentile_ms(c.latency, c.delivered, 0.99);
    Datum v[12] = {Int32GetDatum(c.handler_id),
                   Int64GetDatum(static_cast<int64>(c.delivered)),
                   Int64GetDatum(static_cast<int64>(c.retried)),
                   Int64GetDatum(static_cast<int64>(c.dead)),
                   Float8GetDatum(p50),
                   Float8GetDatum(p99),
                   Int64GetDatum(static_cast<int64>(c.http_status[2])),
                   Int64GetDatum(static_cast<int64>(c.http_status[3])),
                   Int64GetDatum(static_cast<int64>(c.http_status[4])),
                   Int64GetDatum(static_cast<int64>(c.http_status[5])),
                   Int64GetDatum(static_cast<int64>(c.http_status[0] + c.http_status[1])),
                   TimestampTzGetDatum(c.breaker_until)};
    bool n[12] = {false, false, false, false, p50 < 0, p99 < 0,
                  false, false, false, false, false,   c.breaker_until == 0};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
  }
  return (Datum)0;
}

// relay._handler_sends(): per handler of this database, its attempts that went
// out since server start (an HTTP exchange, a Kafka produce to its
// acknowledgement), their send-time percentiles and sum, and the kafka
// messages acknowledged after a gap of their key.
extern "C" Datum relay_handler_sends(PG_FUNCTION_ARGS) {
  InitMaterializedSRF(fcinfo, 0);
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  int count = 0;
  const HandlerCounters* copy = copy_handler_counters(&count);
  for (int i = 0; i < count; i++) {
    const HandlerCounters& c = copy[i];
    double p50 = percentile_ms(c.send_latency, c.sends, 0.50);
    double p99 = percentile_ms(c.send_latency, c.sends, 0.99);
    Datum v[6] = {Int32GetDatum(c.handler_id),
                  Int64GetDatum(static_cast<int64>(c.sends)),
                  Float8GetDatum(p50),
                  Float8GetDatum(p99),
                  Float8GetDatum(static_cast<double>(c.send_sum_us) / 1e6),
                  Int64GetDatum(static_cast<int64>(c.delivered_after_gap))};
    bool n[6] = {false, false, p50 < 0, p99 < 0, false, false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
  }
  return (Datum)0;
}

// relay._handler_limits(): per handler of this database with a shared limit
// (rate, max_concurrency), its deliveries that waited for a permit since server
// start, and whether one was refused within the last second (held back now).
extern "C" Datum relay_handler_limits(PG_FUNCTION_ARGS) {
  InitMaterializedSRF(fcinfo, 0);
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  if (workers == nullptr) return (Datum)0;
  auto* copy = static_cast<HandlerLimit*>(palloc(sizeof(HandlerLimit) * kMaxHandlerStats));
  int n_copied = 0;
  SpinLockAcquire(&workers->limits_lock);
  for (int i = 0; i < kMaxHandlerStats; i++)
    if (workers->limits[i].dboid == MyDatabaseId) copy[n_copied++] = workers->limits[i];
  SpinLockRelease(&workers->limits_lock);
  const int64 now = timestamptz_to_epoch_ms(GetCurrentTimestamp());
  for (int i = 0; i < n_copied; i++) {
    const HandlerLimit& l = copy[i];
    Datum v[3] = {Int32GetDatum(l.handler_id), Int64GetDatum(static_cast<int64>(l.held_back)),
                  BoolGetDatum(l.held_back_at_ms != 0 && now - l.held_back_at_ms < 1000)};
    bool n[3] = {false, false, false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
  }
  return (Datum)0;
}
