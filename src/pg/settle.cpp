#include "pg/settle.hpp"

#include "pg/boundary.hpp"
#include "pg/catalog_cache.hpp"
#include "pg/claim_frontier.hpp"
#include "pg/cpp/failure_decision.h"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"

extern "C" {
#include "common/pg_prng.h"
}

namespace relaybus::pg {

namespace {

SavedPlan judge_plan = {"SELECT id, handler_id, attempt FROM relay.deliveries WHERE id = ANY ($1)",
                        1,
                        {INT8ARRAYOID},
                        nullptr,
                        PlanShape::IdLookups};

SavedPlan delivered_plan = {"DELETE FROM relay.deliveries WHERE id = ANY ($1) RETURNING id, handler_id, published_at",
                            1,
                            {INT8ARRAYOID},
                            nullptr,
                            PlanShape::IdLookups};

SavedPlan retry_plan = {
    "UPDATE relay.deliveries d SET attempt = d.attempt + 1, last_error = u.error, not_before = u.not_before"
    " FROM unnest($1::int8[], $2::text[], $3::timestamptz[]) AS u (id, error, not_before)"
    " WHERE d.id = u.id RETURNING d.id, d.handler_id",
    3,
    {INT8ARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID},
    nullptr,
    PlanShape::IdLookups};

// The handler's name is kept with the dead letter (relay_replay finds it by
// name after the handler was recreated).
SavedPlan dead_plan = {
    "WITH u AS (SELECT * FROM unnest($1::int8[], $2::text[], $3::int4[]) AS u (id, error, status)),"
    " d AS (DELETE FROM relay.deliveries d USING u WHERE d.id = u.id"
    "       RETURNING d.*, u.error AS settle_error, u.status AS settle_status)"
    " INSERT INTO relay.dead_letters (id, event_id, seq, published_at, handler_id, attempts, lane,"
    "   priority, handler, topic, wire_topic, key, payload, headers, last_error, last_status)"
    " SELECT d.id, d.event_id, d.seq, d.published_at, d.handler_id, d.attempt + 1, d.lane, d.priority,"
    "        coalesce((SELECT h.name FROM relay.handlers h WHERE h.id = d.handler_id), '?'),"
    "        d.topic, d.wire_topic, d.key, d.payload, d.headers, d.settle_error, nullif(d.settle_status, 0)"
    " FROM d RETURNING id, handler_id",
    3,
    {INT8ARRAYOID, TEXTARRAYOID, INT4ARRAYOID},
    nullptr,
    PlanShape::IdLookups};

// (id, index into the settlements), sorted by id: results come back by id.
struct IdIndex {
  int64 id;
  int index;
};

int cmp_id_index(const void* a, const void* b) {
  int64 x = static_cast<const IdIndex*>(a)->id, y = static_cast<const IdIndex*>(b)->id;
  return x < y ? -1 : (x > y ? 1 : 0);
}

IdIndex* index_by_id(const Settlement* s, int n) {
  auto* idx = static_cast<IdIndex*>(palloc(sizeof(IdIndex) * n));
  for (int i = 0; i < n; i++) idx[i] = {s[i].id, i};
  qsort(idx, n, sizeof(IdIndex), cmp_id_index);
  return idx;
}

// Every settlement with delivery id `id` (an id may come twice, e.g. in relay_ack).
template <typename F>
void for_each_with_id(const IdIndex* idx, int n, int64 id, F&& f) {
  IdIndex key = {id, 0};
  auto* hit = static_cast<const IdIndex*>(bsearch(&key, idx, n, sizeof(IdIndex), cmp_id_index));
  if (hit == nullptr) return;
  while (hit > idx && (hit - 1)->id == id) hit--;
  for (; hit < idx + n && hit->id == id; hit++) f(hit->index);
}

Datum int8_array(const Datum* v, int n) {
  return PointerGetDatum(construct_array(const_cast<Datum*>(v), n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

Datum array_with_nulls(Datum* v, bool* nulls, int n, Oid type, int len, bool byval, char align) {
  int dims[1] = {n};
  int lbs[1] = {1};
  return PointerGetDatum(construct_md_array(v, nulls, 1, dims, lbs, type, len, byval, align));
}

// The settlements of one outcome, as the statement's array arguments.
struct Batch {
  int n = 0;
  Datum* ids;
  Datum* errors;
  bool* error_nulls;
  Datum* extra;  // Retry: not_before; Dead: status
  explicit Batch(int cap)
      : ids(static_cast<Datum*>(palloc(sizeof(Datum) * cap))),
        errors(static_cast<Datum*>(palloc(sizeof(Datum) * cap))),
        error_nulls(static_cast<bool*>(palloc(sizeof(bool) * cap))),
        extra(static_cast<Datum*>(palloc(sizeof(Datum) * cap))) {}
  void add(const Settlement& s, Datum x) {
    ids[n] = Int64GetDatum(s.id);
    error_nulls[n] = s.error == nullptr;
    errors[n] = s.error != nullptr ? CStringGetTextDatum(s.error) : (Datum)0;
    extra[n++] = x;
  }
};

}  // namespace

void judge_failures(Settlement* s, int n) {
  if (n == 0) return;
  Datum* ids = static_cast<Datum*>(palloc(sizeof(Datum) * n));
  for (int i = 0; i < n; i++) ids[i] = Int64GetDatum(s[i].id);
  Datum arg = int8_array(ids, n);
  spi_exec_latest(&judge_plan, &arg, nullptr, true, 0);
  IdIndex* idx = index_by_id(s, n);
  int rows = static_cast<int>(SPI_processed);
  for (int r = 0; r < rows; r++) {
    bool isnull = false;
    int64 id = spi_int64(r, 1);
    int32 handler_id = DatumGetInt32(spi_col(r, 2, &isnull));
    int32 attempt = DatumGetInt32(spi_col(r, 3, &isnull));
    const HandlerEntry* h = catalog_handler_by_id(handler_id);
    const HandlerConfig* config = h != nullptr ? h->config : nullptr;
    for_each_with_id(idx, n, id, [&](int i) {
      bool permanent = s[i].outcome == SettleOutcome::Dead;
      bool dead = false;
      int64 retry_in_ms = 0;
      ErrorRecord err;
      if (!decide_failure(config, permanent, attempt + 1, s[i].retry_in_ms, pg_prng_uint64(&pg_global_prng_state),
                          &dead, &retry_in_ms, &err))
        raise_error(&err);
      s[i].outcome = dead ? SettleOutcome::Dead : SettleOutcome::Retry;
      s[i].retry_in_ms = dead ? 0 : retry_in_ms;
    });
  }
}

int settle(Settlement* s, int n) {
  if (n == 0) return 0;
  TimestampTz now = GetCurrentTimestamp();
  Batch delivered(n), retry(n), dead(n);
  for (int i = 0; i < n; i++) {
    s[i].settled = false;
    switch (s[i].outcome) {
      case SettleOutcome::Delivered:
        delivered.add(s[i], 0);
        break;
      case SettleOutcome::Retry:
        retry.add(s[i], TimestampTzGetDatum(TimestampTzPlusMilliseconds(now, s[i].retry_in_ms)));
        break;
      case SettleOutcome::Dead:
        dead.add(s[i], Int32GetDatum(s[i].status));
        break;
    }
  }
  IdIndex* idx = index_by_id(s, n);
  int settled = 0;
  auto mark = [&](int r, int32* handler_id) {
    bool isnull = false;
    int64 id = spi_int64(r, 1);
    *handler_id = DatumGetInt32(spi_col(r, 2, &isnull));
    for_each_with_id(idx, n, id, [&](int i) {
      if (!s[i].settled) settled++;
      s[i].settled = true;
      s[i].handler_id = *handler_id;
    });
    return id;
  };

  if (delivered.n > 0) {
    Datum arg = int8_array(delivered.ids, delivered.n);
    spi_exec_latest(&delivered_plan, &arg, nullptr, false, 0);
    int rows = static_cast<int>(SPI_processed);
    for (int r = 0; r < rows; r++) {
      bool isnull = false;
      int32 handler_id;
      (void)mark(r, &handler_id);
      count_delivered_at_commit(handler_id, now - DatumGetTimestampTz(spi_col(r, 3, &isnull)));
    }
  }
  if (retry.n > 0) {
    Datum args[3] = {
        int8_array(retry.ids, retry.n),
        array_with_nulls(retry.errors, retry.error_nulls, retry.n, TEXTOID, -1, false, TYPALIGN_INT),
        PointerGetDatum(construct_array(retry.extra, retry.n, TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE))};
    spi_exec_latest(&retry_plan, args, nullptr, false, 0);
    int rows = static_cast<int>(SPI_processed);
    for (int r = 0; r < rows; r++) {
      int32 handler_id;
      int64 id = mark(r, &handler_id);
      // A retry is claimable again (from its not_before) below where claims start.
      frontier_lower(handler_id, id);
      count_retried(MyDatabaseId, handler_id, false);
    }
  }
  if (dead.n > 0) {
    Datum args[3] = {int8_array(dead.ids, dead.n),
                     array_with_nulls(dead.errors, dead.error_nulls, dead.n, TEXTOID, -1, false, TYPALIGN_INT),
                     PointerGetDatum(construct_array(dead.extra, dead.n, INT4OID, 4, true, TYPALIGN_INT))};
    spi_exec_latest(&dead_plan, args, nullptr, false, 0);
    int rows = static_cast<int>(SPI_processed);
    for (int r = 0; r < rows; r++) {
      int32 handler_id;
      (void)mark(r, &handler_id);
      count_retried(MyDatabaseId, handler_id, true);
      count_pending_at_commit(handler_id, -1);
    }
  }
  return settled;
}

}  // namespace relaybus::pg
