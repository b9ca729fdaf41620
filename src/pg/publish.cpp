// relay_publish and relay_publish_batch: write an event's deliveries in the
// caller's transaction.
//
// A keyed publish first takes a transaction advisory lock on the key's hash, so
// that publishers of one key serialize until commit, then bumps the key's
// counter (with a fresh snapshot, so that it never meets a concurrent update
// under REPEATABLE READ or SERIALIZABLE), then draws the event id: seq order and
// event id order within a key are commit order. The delivery rows, one per
// routed handler, are written directly (delivery_writer.hpp), not through SPI.

#include <string_view>

#include "core/lane_hash.hpp"
#include "pg/boundary.hpp"
#include "pg/cpp/batch_seqs.h"
#include "pg/catalog_cache.hpp"
#include "pg/dedupe.hpp"
#include "pg/delivery_writer.hpp"
#include "pg/key_counter.hpp"
#include "pg/pg_includes.hpp"
#include "pg/publish_args.hpp"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"

extern "C" {
#include "commands/sequence.h"
#include "storage/lock.h"
#include "tcop/utility.h"
PG_FUNCTION_INFO_V1(relay_publish);
PG_FUNCTION_INFO_V1(relay_publish_v1);
PG_FUNCTION_INFO_V1(relay_publish_v2);
PG_FUNCTION_INFO_V1(relay_publish_batch);
PG_FUNCTION_INFO_V1(relay_publish_batch_v1);
PG_FUNCTION_INFO_V1(relay_publish_batch_v2);
}

namespace relaybus::pg {

#define RELAY_DELIVERY_COLUMNS                                                         \
  "id, event_id, seq, published_at, not_before, handler_id, attempt, lane, priority, " \
  "topic, wire_topic, key, payload, headers"

// The key's counter: an UPDATE first (one WAL record, a HOT update), the upsert
// only for a key's first event. ON CONFLICT DO UPDATE would lock the row before
// updating it, a second WAL record per keyed event.
static SavedPlan seq_update_plan = {
    "UPDATE relay.key_seqs SET seq = seq + 1 WHERE key = $1 RETURNING seq", 1, {TEXTOID}, nullptr};

static SavedPlan seq_upsert_plan = {
    "INSERT INTO relay.key_seqs AS k (key, seq) VALUES ($1, 1)"
    " ON CONFLICT (key) DO UPDATE SET seq = k.seq + 1 RETURNING k.seq",
    1,
    {TEXTOID},
    nullptr};

// A batch's counters for keys the direct path did not bump (a key's first
// events): the upsert, which returns every key's last seq.
static SavedPlan batch_seq_plan = {
    "INSERT INTO relay.key_seqs AS k (key, seq)"
    " SELECT u.key, count(*) FROM pg_catalog.unnest($1::text[]) AS u(key)"
    "  WHERE u.key IS NOT NULL GROUP BY u.key ORDER BY u.key"
    " ON CONFLICT (key) DO UPDATE SET seq = k.seq + excluded.seq"
    " RETURNING k.key, k.seq",
    1,
    {TEXTARRAYOID},
    nullptr};

// Deliveries through SPI, only when relay.deliveries is not as this version
// created it (see delivery_writer.hpp): one row per (event, route).
static SavedPlan fallback_insert_plan = {
    "INSERT INTO relay.deliveries (" RELAY_DELIVERY_COLUMNS
    ")"
    " SELECT pg_catalog.nextval('relay.delivery_id_seq'::pg_catalog.regclass), e.eid, e.seq,"
    "        pg_catalog.now(), coalesce($7, pg_catalog.now()), h.hid, 0, e.lane, $6, $5, h.wire,"
    "        e.key, e.p, $8"
    "   FROM unnest($1::int8[], $2::int8[], $3::int2[], $4::text[], $9::jsonb[])"
    "          WITH ORDINALITY AS e(eid, seq, lane, key, p, i),"
    "        unnest($10::int4[], $11::text[]) AS h(hid, wire)"
    "  ORDER BY e.i, h.hid",
    11,
    {INT8ARRAYOID, INT8ARRAYOID, INT2ARRAYOID, TEXTARRAYOID, TEXTOID, INT2OID, TIMESTAMPTZOID, JSONBOID, JSONBARRAYOID,
     INT4ARRAYOID, TEXTARRAYOID},
    nullptr};

static int cmp_uint64(const void* a, const void* b) {
  uint64 x = *static_cast<const uint64*>(a), y = *static_cast<const uint64*>(b);
  return x < y ? -1 : (x > y ? 1 : 0);
}

// Serializes publishers of one key until commit (see the file comment).
static void lock_key(const char* key, int len) {
  LOCKTAG tag;
  uint64 h = core::fnv1a64(std::string_view(key, len));
  SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(h >> 32), static_cast<uint32>(h), 3);
  (void)LockAcquire(&tag, ExclusiveLock, false, false);
}

// Whether a routed handler is delivered by the background workers (a pull
// handler's consumers poll; waking the dispatchers for it is wasted work).
static bool needs_workers(const RouteTarget* targets, int n) {
  for (int i = 0; i < n; i++)
    if (targets[i].by_workers) return true;
  return false;
}

static int64 next_event_id() { return nextval_internal(relay_event_seq(), false); }

// Bumps the key's counter and returns its new value. Runs under the key's lock
// and with a fresh snapshot (see the file comment).
static int64 bump_key_seq(const char* key) {
  Datum k = CStringGetTextDatum(key);
  int64 seq = 0;
  CounterBump done = key_counter_bump(k, &seq);
  if (done == CounterBump::Bumped) return seq;
  SpiScope scope;
  spi_begin(&scope);
  if (done == CounterBump::UseSql) spi_exec_latest(&seq_update_plan, &k, nullptr, false, 0);
  if (done == CounterBump::NoRow || SPI_processed == 0) spi_exec_latest(&seq_upsert_plan, &k, nullptr, false, 0);
  seq = spi_int64(0, 1);
  spi_end(&scope);
  return seq;
}

// The events of one call, ready to become delivery rows.
struct EventRows {
  int n;
  const int64* event_ids;
  const int64* seqs;  // ignored where keys[i] is 0
  const int16* lanes;
  const Datum* keys;  // text, or 0 for an unkeyed event
  const Datum* payloads;
};

// Same rows as the direct path, through SPI (see delivery_writer.hpp).
static void insert_deliveries_spi(const PublishCommon& common, Datum topic, const EventRows& ev,
                                  const RouteTarget* targets, int ntargets) {
  int n = ev.n;
  bool* key_nulls = static_cast<bool*>(palloc(sizeof(bool) * n));
  Datum* seqs = static_cast<Datum*>(palloc(sizeof(Datum) * n));
  Datum* ids = static_cast<Datum*>(palloc(sizeof(Datum) * n));
  Datum* lanes = static_cast<Datum*>(palloc(sizeof(Datum) * n));
  for (int i = 0; i < n; i++) {
    key_nulls[i] = ev.keys[i] == 0;
    seqs[i] = Int64GetDatum(ev.seqs[i]);
    ids[i] = Int64GetDatum(ev.event_ids[i]);
    lanes[i] = Int16GetDatum(ev.lanes[i]);
  }
  Datum* hids = static_cast<Datum*>(palloc(sizeof(Datum) * ntargets));
  Datum* wires = static_cast<Datum*>(palloc(sizeof(Datum) * ntargets));
  bool* wire_nulls = static_cast<bool*>(palloc(sizeof(bool) * ntargets));
  for (int i = 0; i < ntargets; i++) {
    hids[i] = Int32GetDatum(targets[i].handler_id);
    wire_nulls[i] = targets[i].wire_name == nullptr;
    wires[i] = wire_nulls[i] ? (Datum)0 : CStringGetTextDatum(targets[i].wire_name);
  }
  int dims[1] = {n};
  int lbs[1] = {1};
  int hdims[1] = {ntargets};
  Datum values[11] = {
      PointerGetDatum(construct_array(ids, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE)),
      PointerGetDatum(construct_md_array(seqs, key_nulls, 1, dims, lbs, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE)),
      PointerGetDatum(construct_array(lanes, n, INT2OID, 2, true, TYPALIGN_SHORT)),
      PointerGetDatum(
          construct_md_array(const_cast<Datum*>(ev.keys), key_nulls, 1, dims, lbs, TEXTOID, -1, false, TYPALIGN_INT)),
      topic,
      Int16GetDatum(static_cast<int16>(common.priority)),
      TimestampTzGetDatum(common.not_before),
      common.headers,
      PointerGetDatum(construct_array(const_cast<Datum*>(ev.payloads), n, JSONBOID, -1, false, TYPALIGN_INT)),
      PointerGetDatum(construct_array(hids, ntargets, INT4OID, 4, true, TYPALIGN_INT)),
      PointerGetDatum(construct_md_array(wires, wire_nulls, 1, hdims, lbs, TEXTOID, -1, false, TYPALIGN_INT))};
  char nulls[12] = "           ";
  if (common.not_before_null) nulls[6] = 'n';
  if (common.headers_null) nulls[7] = 'n';
  SpiScope scope;
  spi_begin(&scope);
  spi_exec(&fallback_insert_plan, values, nulls, false, 0);
  spi_end(&scope);
}

// One delivery per (event, route), events in order.
static void insert_deliveries(const PublishCommon& common, const EventRows& ev, const RouteTarget* targets,
                              int ntargets) {
  // The transaction id comes before any delivery id is drawn: the
  // dispatchers' claim floors rely on that order (claim_floor.hpp).
  (void)GetCurrentTransactionId();
  for (int t = 0; t < ntargets; t++) count_published_at_commit(targets[t].handler_id, ev.n);
  Datum topic = CStringGetTextDatum(common.topic);
  DeliveryWriter w;
  if (!delivery_writer_open(&w)) {
    insert_deliveries_spi(common, topic, ev, targets, ntargets);
    return;
  }
  Datum* wires = static_cast<Datum*>(palloc(sizeof(Datum) * ntargets));
  for (int t = 0; t < ntargets; t++)
    wires[t] = targets[t].wire_name == nullptr ? (Datum)0 : CStringGetTextDatum(targets[t].wire_name);
  DeliveryRow row;
  row.not_before = common.not_before_null ? w.now : common.not_before;
  row.priority = static_cast<int16>(common.priority);
  row.topic = topic;
  row.headers = common.headers_null ? (Datum)0 : common.headers;
  for (int i = 0; i < ev.n; i++) {
    row.event_id = ev.event_ids[i];
    row.seq = ev.seqs[i];
    row.lane = ev.lanes[i];
    row.key = ev.keys[i];
    row.payload = ev.payloads[i];
    for (int t = 0; t < ntargets; t++) {
      row.handler_id = targets[t].handler_id;
      row.wire_topic = wires[t];
      delivery_writer_insert(&w, row);
    }
  }
  delivery_writer_close(&w);
}

}  // namespace relaybus::pg

using namespace relaybus;
using namespace relaybus::pg;

// relay_publish's body; its entry points (below) pass dedupe_key, or NULL for
// 0.1.0's signature, which has none.
static Datum publish_event(FunctionCallInfo fcinfo, text* dedupe_key) {
  // The rows are written without the executor, which would have checked this.
  PreventCommandIfReadOnly("relay_publish()");
  PublishCommon common;
  read_publish_common(fcinfo, /*headers*/ 3, /*priority*/ 4, /*not_before*/ 5, &common);

  if (PG_ARGISNULL(1)) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("payload must not be NULL")));
  Datum payload = PG_GETARG_DATUM(1);
  check_payload_size(payload, -1);

  int key_len = 0;
  char* key = PG_ARGISNULL(2) ? nullptr : text_arg(fcinfo, 2, &key_len);
  if (key != nullptr) check_key(key, key_len, -1);

  // An event published with the dedupe key within the window is returned
  // instead (dedupe.hpp).
  int dedupe_len = dedupe_key == nullptr ? 0 : VARSIZE_ANY_EXHDR(dedupe_key);
  char* dedupe = dedupe_key == nullptr ? nullptr : text_to_cstring(dedupe_key);
  if (dedupe != nullptr) {
    check_dedupe_key(dedupe, dedupe_len, -1);
    dedupe_lock(&dedupe, &dedupe_len, 1);
    int64 earlier = 0;
    if (dedupe_find(dedupe, &earlier)) PG_RETURN_INT64(earlier);
  }

  lock_deliveries_for_publish();  // before the routes are read (see there)
  const RouteTarget* targets = nullptr;
  int ntargets = catalog_routes_for(common.topic, &targets);
  if (ntargets == 0) {
    int64 unrouted_id = next_event_id();
    if (dedupe != nullptr) dedupe_record(dedupe, unrouted_id);
    PG_RETURN_INT64(unrouted_id);
  }
  bool wake = needs_workers(targets, ntargets);

  int64 seq = 0;
  int16 lane = 0;
  Datum key_datum = (Datum)0;
  if (key != nullptr) {
    lock_key(key, key_len);
    seq = bump_key_seq(key);
    lane = static_cast<int16>(core::lane_for_key(std::string_view(key, key_len)));
    key_datum = CStringGetTextDatum(key);
  }
  // After the key's counter is locked, so within one key id order is commit order.
  int64 event_id = next_event_id();
  if (key == nullptr) lane = static_cast<int16>(event_id % core::kLanes);
  EventRows ev = {1, &event_id, &seq, &lane, &key_datum, &payload};
  insert_deliveries(common, ev, targets, ntargets);
  if (dedupe != nullptr) dedupe_record(dedupe, event_id);
  if (wake) wake_dispatchers_at_commit();
  PG_RETURN_INT64(event_id);
}

namespace relaybus::pg {

// A batch's dedupe keys (plain arrays: this runs between PostgreSQL calls).
struct BatchDedupe {
  int n;        // events as called
  char** keys;  // per event; nullptr: none
  int* lens;
  int* first;     // per event with a key: the first event of the batch with that key
  int64* ids;     // per event: its id (an earlier event's, or the one it gets)
  bool* earlier;  // per first event: its key names an earlier event
  int* kept;      // per event that is published: its position in the call
  int nkept;
};

static char** sort_keys;  // for cmp_key_index only
static int cmp_key_index(const void* a, const void* b) {
  int x = *static_cast<const int*>(a), y = *static_cast<const int*>(b);
  int c = strcmp(sort_keys[x], sort_keys[y]);
  return c != 0 ? c : (x < y ? -1 : (x > y ? 1 : 0));
}

// Reads dedupe_keys, takes their locks, and finds which events name an earlier
// event (left out, given its id) or repeat a key of the batch (left out, given
// the first one's id). The others are kept, in order.
static void batch_dedupe_begin(ArrayType* arr, int n, BatchDedupe* dd) {
  if (ARR_NDIM(arr) > 1)
    ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR), errmsg("dedupe_keys must be a one-dimensional array")));
  Datum* kd;
  bool* kn;
  int nk;
  deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &kd, &kn, &nk);
  if (nk != n)
    ereport(ERROR,
            (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR), errmsg("dedupe_keys must have as many elements as payloads"),
             errdetail("%d payloads, %d dedupe_keys.", n, nk)));
  dd->n = n;
  dd->keys = static_cast<char**>(palloc0(sizeof(char*) * (n + 1)));
  dd->lens = static_cast<int*>(palloc0(sizeof(int) * (n + 1)));
  dd->first = static_cast<int*>(palloc(sizeof(int) * (n + 1)));
  dd->ids = static_cast<int64*>(palloc0(sizeof(int64) * (n + 1)));
  dd->earlier = static_cast<bool*>(palloc0(sizeof(bool) * (n + 1)));
  dd->kept = static_cast<int*>(palloc(sizeof(int) * (n + 1)));
  int* with_key = static_cast<int*>(palloc(sizeof(int) * (n + 1)));
  char** lock_keys = static_cast<char**>(palloc(sizeof(char*) * (n + 1)));
  int* lock_lens = static_cast<int*>(palloc(sizeof(int) * (n + 1)));
  int nwith = 0;
  for (int i = 0; i < n; i++) {
    dd->first[i] = i;
    if (kn[i]) continue;
    text* t = DatumGetTextPP(kd[i]);
    dd->lens[i] = VARSIZE_ANY_EXHDR(t);
    dd->keys[i] = text_to_cstring(t);
    check_dedupe_key(dd->keys[i], dd->lens[i], i + 1);
    lock_keys[nwith] = dd->keys[i];
    lock_lens[nwith] = dd->lens[i];
    with_key[nwith++] = i;
  }
  dedupe_lock(lock_keys, lock_lens, nwith);
  sort_keys = dd->keys;
  qsort(with_key, nwith, sizeof(int), cmp_key_index);
  for (int j = 0; j < nwith; j++) {
    int i = with_key[j];
    if (j > 0 && strcmp(dd->keys[i], dd->keys[with_key[j - 1]]) == 0) {
      dd->first[i] = dd->first[with_key[j - 1]];
      continue;
    }
    dd->earlier[i] = dedupe_find(dd->keys[i], &dd->ids[i]);
  }
  dd->nkept = 0;
  for (int i = 0; i < n; i++)
    if (dd->first[i] == i && !dd->earlier[i]) dd->kept[dd->nkept++] = i;
}

// The ids of the events as called, recording the new events' dedupe keys.
static Datum batch_dedupe_end(BatchDedupe* dd, const int64* event_ids) {
  for (int j = 0; j < dd->nkept; j++) {
    int i = dd->kept[j];
    dd->ids[i] = event_ids[j];
    if (dd->keys[i] != nullptr) dedupe_record(dd->keys[i], event_ids[j]);
  }
  Datum* ids = static_cast<Datum*>(palloc(sizeof(Datum) * (dd->n + 1)));
  for (int i = 0; i < dd->n; i++) ids[i] = Int64GetDatum(dd->ids[dd->first[i]]);
  return PointerGetDatum(construct_array(ids, dd->n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

}  // namespace relaybus::pg

// relay_publish_batch's body; its entry points (below) pass dedupe_keys, or
// NULL for 0.1.0's signature, which has none.
static Datum publish_events(FunctionCallInfo fcinfo, ArrayType* dedupe_keys) {
  PreventCommandIfReadOnly("relay_publish_batch()");
  PublishCommon common;
  read_publish_common(fcinfo, 3, 4, 5, &common);

  if (PG_ARGISNULL(1)) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("payloads must not be NULL")));
  ArrayType* payload_array = PG_GETARG_ARRAYTYPE_P(1);
  if (ARR_NDIM(payload_array) > 1)
    ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR), errmsg("payloads must be a one-dimensional array")));
  Datum* payloads;
  bool* payload_nulls;
  int n;
  deconstruct_array(payload_array, JSONBOID, -1, false, TYPALIGN_INT, &payloads, &payload_nulls, &n);
  if (n > kMaxBatch)
    ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("too many events in one batch: %d", n),
                    errdetail("relay_publish_batch takes at most %d events per call.", kMaxBatch)));
  for (int i = 0; i < n; i++) {
    if (payload_nulls[i])
      ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("payloads[%d] must not be NULL", i + 1)));
    check_payload_size(payloads[i], i + 1);
  }

  char** keys = static_cast<char**>(palloc0(sizeof(char*) * (n + 1)));
  int* key_lens = static_cast<int*>(palloc0(sizeof(int) * (n + 1)));
  bool* key_nulls = static_cast<bool*>(palloc(sizeof(bool) * (n + 1)));
  bool any_key = false;
  for (int i = 0; i < n; i++) key_nulls[i] = true;
  if (!PG_ARGISNULL(2)) {
    ArrayType* key_array = PG_GETARG_ARRAYTYPE_P(2);
    Datum* kd;
    bool* kn;
    int nk;
    if (ARR_NDIM(key_array) > 1)
      ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR), errmsg("keys must be a one-dimensional array")));
    deconstruct_array(key_array, TEXTOID, -1, false, TYPALIGN_INT, &kd, &kn, &nk);
    if (nk != n)
      ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR), errmsg("keys must have as many elements as payloads"),
                      errdetail("%d payloads, %d keys.", n, nk)));
    for (int i = 0; i < n; i++) {
      key_nulls[i] = kn[i];
      if (kn[i]) continue;
      text* t = DatumGetTextPP(kd[i]);
      key_lens[i] = VARSIZE_ANY_EXHDR(t);
      keys[i] = text_to_cstring(t);
      check_key(keys[i], key_lens[i], i + 1);
      any_key = true;
    }
  }

  if (n == 0) PG_RETURN_ARRAYTYPE_P(construct_empty_array(INT8OID));

  // With dedupe_keys, the events published from here on are the kept ones;
  // the others get their earlier event's id (dedupe.hpp).
  BatchDedupe dd = {};
  bool dedupe = dedupe_keys != nullptr;
  if (dedupe) {
    batch_dedupe_begin(dedupe_keys, n, &dd);
    if (dd.nkept < n) {
      any_key = false;
      for (int j = 0; j < dd.nkept; j++) {
        int i = dd.kept[j];
        payloads[j] = payloads[i];
        keys[j] = keys[i];
        key_lens[j] = key_lens[i];
        key_nulls[j] = key_nulls[i];
        any_key = any_key || !key_nulls[j];
      }
      n = dd.nkept;
    }
    if (n == 0) PG_RETURN_DATUM(batch_dedupe_end(&dd, nullptr));
  }

  lock_deliveries_for_publish();  // before the routes are read (see there)
  const RouteTarget* targets = nullptr;
  int ntargets = catalog_routes_for(common.topic, &targets);
  int64* event_ids = static_cast<int64*>(palloc(sizeof(int64) * (n + 1)));
  if (ntargets == 0) {
    for (int i = 0; i < n; i++) event_ids[i] = next_event_id();
    if (dedupe) PG_RETURN_DATUM(batch_dedupe_end(&dd, event_ids));
    Datum* ids = static_cast<Datum*>(palloc(sizeof(Datum) * (n + 1)));
    for (int i = 0; i < n; i++) ids[i] = Int64GetDatum(event_ids[i]);
    PG_RETURN_ARRAYTYPE_P(construct_array(ids, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
  }
  bool wake = needs_workers(targets, ntargets);

  int64* seqs = static_cast<int64*>(palloc0(sizeof(int64) * (n + 1)));
  int16* lanes = static_cast<int16*>(palloc0(sizeof(int16) * (n + 1)));
  if (any_key) {
    // Lock the keys' hashes in a fixed order so that two batches never deadlock.
    uint64* hashes = static_cast<uint64*>(palloc(sizeof(uint64) * n));
    int nh = 0;
    for (int i = 0; i < n; i++)
      if (!key_nulls[i]) hashes[nh++] = core::fnv1a64(std::string_view(keys[i], key_lens[i]));
    qsort(hashes, nh, sizeof(uint64), cmp_uint64);
    for (int i = 0; i < nh; i++) {
      if (i > 0 && hashes[i] == hashes[i - 1]) continue;
      LOCKTAG tag;
      SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(hashes[i] >> 32), static_cast<uint32>(hashes[i]), 3);
      (void)LockAcquire(&tag, ExclusiveLock, false, false);
    }
    // The distinct keys and how many events each has, bumped directly
    // (key_counter.hpp); a key's first events, and any key the direct path
    // leaves to SQL, take the upsert.
    int* order = static_cast<int*>(palloc(sizeof(int) * (n + 1)));
    int nkeyed = 0;
    for (int i = 0; i < n; i++)
      if (!key_nulls[i]) order[nkeyed++] = i;
    sort_keys = keys;
    qsort(order, nkeyed, sizeof(int), cmp_key_index);
    Datum* dkeys = static_cast<Datum*>(palloc(sizeof(Datum) * (n + 1)));
    char** dnames = static_cast<char**>(palloc(sizeof(char*) * (n + 1)));
    int64* dadds = static_cast<int64*>(palloc(sizeof(int64) * (n + 1)));
    int nd = 0;
    for (int j = 0; j < nkeyed; j++) {
      char* k = keys[order[j]];
      if (nd > 0 && strcmp(dnames[nd - 1], k) == 0) {
        dadds[nd - 1]++;
        continue;
      }
      dnames[nd] = k;
      dkeys[nd] = CStringGetTextDatum(k);
      dadds[nd++] = 1;
    }
    CounterBump* bumped = static_cast<CounterBump*>(palloc(sizeof(CounterBump) * (nd + 1)));
    int64* dlast = static_cast<int64*>(palloc(sizeof(int64) * (nd + 1)));
    key_counter_bump_batch(nd, dkeys, dadds, bumped, dlast);
    char** rkeys = static_cast<char**>(palloc(sizeof(char*) * (n + 1)));
    int64* rlast = static_cast<int64*>(palloc(sizeof(int64) * (n + 1)));
    Datum* missing = static_cast<Datum*>(palloc(sizeof(Datum) * (n + 1)));
    int nres = 0;
    int m = 0;
    for (int d = 0; d < nd; d++) {
      if (bumped[d] == CounterBump::Bumped) {
        rkeys[nres] = dnames[d];
        rlast[nres++] = dlast[d];
      } else {
        for (int64 c = 0; c < dadds[d]; c++) missing[m++] = dkeys[d];
      }
    }
    if (m > 0) {
      // The returned key names are copied out of SPI's memory, which
      // spi_end frees before assign_batch_seqs reads them.
      MemoryContext caller_cxt = CurrentMemoryContext;
      SpiScope scope;
      spi_begin(&scope);
      Datum missing_array = PointerGetDatum(construct_array(missing, m, TEXTOID, -1, false, TYPALIGN_INT));
      spi_exec_latest(&batch_seq_plan, &missing_array, nullptr, false, 0);
      for (uint64 j = 0; j < SPI_processed && nres < n; j++, nres++) {
        rkeys[nres] = MemoryContextStrdup(caller_cxt, SPI_getvalue(SPI_tuptable->vals[j], SPI_tuptable->tupdesc, 1));
        rlast[nres] = spi_int64(static_cast<int>(j), 2);
      }
      spi_end(&scope);
    }
    ErrorRecord err;
    if (!assign_batch_seqs(n, keys, key_lens, key_nulls, nres, rkeys, rlast, seqs, lanes, &err))
      raise_error_in("relaybus", &err);
  }

  // Event ids in batch order, drawn after the keys' counters are locked.
  Datum* key_datums = static_cast<Datum*>(palloc(sizeof(Datum) * (n + 1)));
  for (int i = 0; i < n; i++) {
    event_ids[i] = next_event_id();
    if (key_nulls[i]) {
      lanes[i] = static_cast<int16>(event_ids[i] % core::kLanes);
      key_datums[i] = (Datum)0;
    } else {
      key_datums[i] = CStringGetTextDatum(keys[i]);
    }
  }
  EventRows ev = {n, event_ids, seqs, lanes, key_datums, payloads};
  insert_deliveries(common, ev, targets, ntargets);
  if (wake) wake_dispatchers_at_commit();
  if (dedupe) PG_RETURN_DATUM(batch_dedupe_end(&dd, event_ids));
  Datum* ids = static_cast<Datum*>(palloc(sizeof(Datum) * (n + 1)));
  for (int i = 0; i < n; i++) ids[i] = Int64GetDatum(event_ids[i]);
  PG_RETURN_ARRAYTYPE_P(construct_array(ids, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

// The entry points, one per SQL signature. The current install script names
// the _v2 ones.
//   relay_publish(topic, payload, key, headers, priority, not_before, dedupe_key): 0.2.0
//   relay_publish(topic, payload, key, headers, priority, not_before): 0.1.0
extern "C" Datum relay_publish_v2(PG_FUNCTION_ARGS) {
  return publish_event(fcinfo, PG_ARGISNULL(6) ? nullptr : PG_GETARG_TEXT_PP(6));
}
extern "C" Datum relay_publish_v1(PG_FUNCTION_ARGS) { return publish_event(fcinfo, nullptr); }
extern "C" Datum relay_publish_batch_v2(PG_FUNCTION_ARGS) {
  return publish_events(fcinfo, PG_ARGISNULL(6) ? nullptr : PG_GETARG_ARRAYTYPE_P(6));
}
extern "C" Datum relay_publish_batch_v1(PG_FUNCTION_ARGS) { return publish_events(fcinfo, nullptr); }

// The symbols sql/relaybus--0.1.0.sql names (that script is frozen: it is what
// 0.1.0 installs have), which 0.2.0 installs made before the _v2 entry points
// also name for their seven-argument signatures: the number of arguments tells
// which catalog calls (docs/operations.md, "Changing the SQL").
extern "C" Datum relay_publish(PG_FUNCTION_ARGS) {
  return PG_NARGS() == 6 ? relay_publish_v1(fcinfo) : relay_publish_v2(fcinfo);
}
extern "C" Datum relay_publish_batch(PG_FUNCTION_ARGS) {
  return PG_NARGS() == 6 ? relay_publish_batch_v1(fcinfo) : relay_publish_batch_v2(fcinfo);
}
