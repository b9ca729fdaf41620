// relay_claim: lease ready deliveries of a pull handler and return them.
//
// 1. Scan and plan (core/claim_scan.hpp decides, this file reads): windows
//    of the oldest rows of each priority class (one statement, four index
//    ranges) with a fresh snapshot, widened, key heads and the frontier's
//    keys as the core asks; the core merges the classes by aged priority,
//    takes keys' heads (and up to per_key of a key's run) and skips keys whose
//    head is leased or not ready.
// 3. Charge the scanned deliveries whose lease expired a failed attempt (once
//    per expiry: the charge marks the lease), then lease the chosen ids in
//    shared memory with fresh tokens (no row is written).
// 4. Fetch them again with a snapshot taken after leasing and keep only rows
//    that are still there, ready, and whose earlier deliveries of the key are
//    gone or in this claim. This is the fence against a concurrent ack/nack that
//    the first snapshot did not see.

#include "pg/settle.hpp"
#include "pg/catalog_cache.hpp"
#include "pg/claim.hpp"
#include "pg/claim_floor.hpp"
#include "pg/claim_frontier.hpp"
#include "pg/claim_scan_store.hpp"
#include "pg/leases.hpp"
#include "pg/pg_includes.hpp"
#include "pg/recovery_guard.hpp"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"
#include "pg/trace_context.hpp"
#include "pg/worker_state.hpp"

extern "C" {
PG_FUNCTION_INFO_V1(relay_claim);
}

namespace relaybus::pg {

// Every statement here runs with PlanShape::IndexScans or IdLookups (no
// sequential or bitmap scan, no sort: plan_settings.hpp) and is written so that exactly one
// index returns its rows in the order it asks for; that index scan is its only
// plan, whatever the statistics. A class is a range on priority, not an
// equality, and is ordered by (priority, id): deliveries_claim returns that
// order, while deliveries_pkey (id order, with a filter) would need a sort.
#define CLASS_SCAN(p, lanes)                                    \
  "(SELECT id, priority, key, not_before FROM relay.deliveries" \
  " WHERE handler_id = $1 AND priority >= " #p " AND priority <= " #p lanes " ORDER BY priority, id LIMIT $2)"
#define ALL_CLASSES(lanes)                                                                     \
  "SELECT id, priority, key, not_before FROM (" CLASS_SCAN(3, lanes) " UNION ALL " CLASS_SCAN( \
      2, lanes) " UNION ALL " CLASS_SCAN(1, lanes) " UNION ALL " CLASS_SCAN(0, lanes) ") s"

static SavedPlan scan_plan = {ALL_CLASSES(""), 2, {INT4OID, INT4OID}, nullptr, PlanShape::IndexScans};
static SavedPlan scan_lanes_plan = {
    ALL_CLASSES(" AND lane = ANY ($3)"), 3, {INT4OID, INT4OID, INT2ARRAYOID}, nullptr, PlanShape::IndexScans};
// relay_claim of a busy pull handler starts each class at its frontier
// (claim_frontier.hpp), a dispatcher at its floor (claim_floor.hpp): `id >= $n`
// after `priority >= p` positions the index descent there, past the rows in
// flight and the entries of completed ones.
#define FROM_CLASSES(lanes)                                                                                    \
  "SELECT id, priority, key, not_before FROM (" CLASS_SCAN(3, " AND id >= $3" lanes) " UNION ALL " CLASS_SCAN( \
      2,                                                                                                       \
      " AND id >= $4" lanes) " UNION ALL " CLASS_SCAN(1,                                                       \
                                                      " AND id >= $5" lanes) " UNION ALL " CLASS_SCAN(0,       \
                                                                                                      " AND id >= $6" lanes) ") s"
static SavedPlan scan_from_plan = {
    FROM_CLASSES(""), 6, {INT4OID, INT4OID, INT8OID, INT8OID, INT8OID, INT8OID}, nullptr, PlanShape::IndexScans};
static SavedPlan scan_from_lanes_plan = {FROM_CLASSES(" AND lane = ANY ($7)"),
                                         7,
                                         {INT4OID, INT4OID, INT8OID, INT8OID, INT8OID, INT8OID, INT2ARRAYOID},
                                         nullptr,
                                         PlanShape::IndexScans};

// Key heads: the first per_key deliveries (by seq) of up to $2 keys, found by
// walking deliveries_key one key at a time (one index descent per key) instead
// of reading every row of the keys' runs in id order. Used when a claim's
// window is full of a few keys' runs (hot keys): see claim_deliveries.
#define KEY_HEADS(lanes)                                                                     \
  "WITH RECURSIVE k(key) AS ("                                                               \
  "  (SELECT key FROM relay.deliveries WHERE handler_id = $1 AND key IS NOT NULL"            \
  "    ORDER BY key LIMIT 1)"                                                                \
  "  UNION ALL"                                                                              \
  "  SELECT (SELECT x.key FROM relay.deliveries x WHERE x.handler_id = $1 AND x.key > k.key" \
  "           ORDER BY x.key LIMIT 1) FROM k WHERE k.key IS NOT NULL)"                       \
  " SELECT r.id, r.priority, r.key, r.not_before"                                            \
  "   FROM (SELECT k.key FROM k WHERE k.key IS NOT NULL LIMIT $2) kk,"                       \
  "   LATERAL (SELECT id, priority, key, not_before FROM relay.deliveries"                   \
  "             WHERE handler_id = $1 AND key = kk.key" lanes " ORDER BY seq LIMIT $3) r"
static SavedPlan heads_plan = {KEY_HEADS(""), 3, {INT4OID, INT4OID, INT4OID}, nullptr, PlanShape::IndexScans};
static SavedPlan heads_lanes_plan = {
    KEY_HEADS(" AND lane = ANY ($4)"), 4, {INT4OID, INT4OID, INT4OID, INT2ARRAYOID}, nullptr, PlanShape::IndexScans};

// The first per_key deliveries (by seq) of the keys $2: for a scan from the
// claim frontier, the keys whose earlier rows may lie below it, where the scan
// does not see them (claim_frontier.hpp). One index descent per key.
#define HEADS_OF_KEYS                                                             \
  "SELECT r.id, r.priority, r.key, r.not_before FROM unnest($2::text[]) kk(key)," \
  " LATERAL (SELECT id, priority, key, not_before FROM relay.deliveries"          \
  "           WHERE handler_id = $1 AND key = kk.key ORDER BY seq LIMIT $3) r"
static SavedPlan heads_of_keys_plan = {
    HEADS_OF_KEYS, 3, {INT4OID, TEXTARRAYOID, INT4OID}, nullptr, PlanShape::IndexScans};

// A keyed row is valid only if every delivery of its (handler, key) up to the
// highest seq taken is in this claim: the head and no gap. One count per key
// (an index range on deliveries_key), not one probe per row.
//
// The fetch finds its rows by primary key only: it is planned as IdLookups
// (deliveries_claim, which holds id, is hidden from it), and `handler_id + 0`
// keeps the planner from reading the handler's keyed backlog through
// deliveries_key and filtering the ids. The count of a key's rows is taken
// over rows in seq order, which only deliveries_key returns without a sort.
#define FETCH_WITH                                                                             \
  "WITH d AS MATERIALIZED (SELECT * FROM relay.deliveries x"                                   \
  "                         WHERE x.id = ANY ($1) AND x.handler_id + 0 = $2),"                 \
  " k AS (SELECT d.key, max(d.seq) AS hi, count(*) AS n FROM d WHERE d.key IS NOT NULL"        \
  "       GROUP BY d.key),"                                                                    \
  " whole AS (SELECT k.key FROM k WHERE (SELECT count(*) FROM (SELECT FROM relay.deliveries p" \
  "             WHERE p.handler_id = $2 AND p.key = k.key AND p.seq <= k.hi"                   \
  "             ORDER BY p.seq) run) = k.n) "
#define FETCH_COLUMNS                                                                           \
  FETCH_WITH                                                                                    \
  "SELECT d.id, d.event_id, coalesce(d.wire_topic, d.topic) AS topic, d.key, d.seq, d.payload," \
  "       d.headers, d.attempt + 1, d.priority::int4, d.published_at,"                          \
  "       (d.not_before <= $3 AND (d.key IS NULL OR d.key IN (SELECT w.key FROM whole w))) AS valid"
#define FETCH_FROM " FROM d"

// The fetch's columns (1-based): id, event_id, topic, key, seq, payload,
// headers, attempt, priority, published_at, then valid.
constexpr int kFetchColumns = 10;

static SavedPlan fetch_plan = {
    FETCH_COLUMNS FETCH_FROM, 3, {INT8ARRAYOID, INT4OID, TIMESTAMPTZOID}, nullptr, PlanShape::IdLookups};

static int cmp_int64(const void* a, const void* b) {
  int64 x = *static_cast<const int64*>(a), y = *static_cast<const int64*>(b);
  return x < y ? -1 : (x > y ? 1 : 0);
}

struct IdToken {
  int64 id;  // first: sorted and searched with cmp_int64
  LeaseToken token;
};

static bool all_zero(const int64 from[4]) { return from[0] == 0 && from[1] == 0 && from[2] == 0 && from[3] == 0; }

// One read's rows, copied out of SPI_tuptable (id, priority, key, not_before).
struct ScannedRows {
  int n;
  int64* ids;
  int* priority;
  char** keys;  // nullptr = unkeyed
  int64* ready_at_ms;
  bool* leased;
  bool* expired;    // leased, and the lease ran out without completion
  bool* key_below;  // the frontier says an earlier row of the key may lie below it (nullptr: none)
};

// Reads the rows of SPI_tuptable into out; marks: the frontier whose keys
// are marked (nullptr: none).
static void read_scanned(TimestampTz now, bool take_notified, const FrontierView* marks, ScannedRows* out) {
  int n = static_cast<int>(SPI_processed);
  out->n = n;
  out->ids = static_cast<int64*>(palloc(sizeof(int64) * (n + 1)));
  out->priority = static_cast<int*>(palloc(sizeof(int) * (n + 1)));
  out->keys = static_cast<char**>(palloc(sizeof(char*) * (n + 1)));
  out->ready_at_ms = static_cast<int64*>(palloc(sizeof(int64) * (n + 1)));
  out->leased = static_cast<bool*>(palloc(sizeof(bool) * (n + 1)));
  out->expired = static_cast<bool*>(palloc(sizeof(bool) * (n + 1)));
  out->key_below = nullptr;
  for (int i = 0; i < n; i++) {
    bool isnull = false;
    out->ids[i] = DatumGetInt64(spi_col(i, 1, &isnull));
    out->priority[i] = DatumGetInt16(spi_col(i, 2, &isnull));
    out->keys[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3);
    out->ready_at_ms[i] = timestamptz_to_epoch_ms(DatumGetTimestampTz(spi_col(i, 4, &isnull)));
  }
  if (marks != nullptr && marks->nkeys > 0) {
    out->key_below = static_cast<bool*>(palloc(sizeof(bool) * (n + 1)));
    for (int i = 0; i < n; i++)
      out->key_below[i] = out->keys[i] != nullptr && frontier_view_has_key(*marks, frontier_key_hash(out->keys[i]));
  }
  LeaseState* state = static_cast<LeaseState*>(palloc(sizeof(LeaseState) * (n + 1)));
  leases_lookup(out->ids, n, now, take_notified, state);
  // An expired lease is charged before its delivery goes out again, so it
  // blocks its key in this claim; where no charge can be written (a
  // read-only transaction) it is free as before.
  for (int i = 0; i < n; i++) {
    out->expired[i] = state[i] == LeaseState::Expired && !XactReadOnly;
    out->leased[i] = state[i] == LeaseState::Held || out->expired[i];
  }
}

// Performs one read the claim scan asks for into rows. xmin: of a window
// scan's snapshot (when not nullptr).
static void perform_read(int32 handler_id, const ScanStepData& step, Datum lanes, TimestampTz now, bool take_notified,
                         const FrontierView* marks, ScannedRows* rows, TransactionId* xmin) {
  switch (step.kind) {
    case ScanStep::Window: {
      if (!all_zero(step.from)) {
        Datum values[7] = {Int32GetDatum(handler_id),
                           Int32GetDatum(step.window),
                           Int64GetDatum(step.from[3]),
                           Int64GetDatum(step.from[2]),
                           Int64GetDatum(step.from[1]),
                           Int64GetDatum(step.from[0]),
                           lanes};
        spi_exec_latest(lanes == (Datum)0 ? &scan_from_plan : &scan_from_lanes_plan, values, nullptr, true, 0, xmin);
      } else {
        Datum values[3] = {Int32GetDatum(handler_id), Int32GetDatum(step.window), lanes};
        spi_exec_latest(lanes == (Datum)0 ? &scan_plan : &scan_lanes_plan, values, nullptr, true, 0, xmin);
      }
      read_scanned(now, take_notified, marks, rows);
      return;
    }
    case ScanStep::KeyHeads: {
      Datum values[4] = {Int32GetDatum(handler_id), Int32GetDatum(step.max_keys), Int32GetDatum(step.per_key), lanes};
      spi_exec_latest(lanes == (Datum)0 ? &heads_plan : &heads_lanes_plan, values, nullptr, true, 0);
      read_scanned(now, take_notified, nullptr, rows);
      return;
    }
    case ScanStep::HeadsOfKeys: {
      Datum* keys = static_cast<Datum*>(palloc(sizeof(Datum) * (step.nkeys + 1)));
      for (int k = 0; k < step.nkeys; k++) keys[k] = CStringGetTextDatum(step.keys[k]);
      Datum values[3] = {Int32GetDatum(handler_id),
                         PointerGetDatum(construct_array(keys, step.nkeys, TEXTOID, -1, false, TYPALIGN_INT)),
                         Int32GetDatum(step.per_key)};
      spi_exec_latest(&heads_of_keys_plan, values, nullptr, true, 0);
      read_scanned(now, take_notified, nullptr, rows);
      return;
    }
    case ScanStep::Done:
      return;
  }
}

// Per backend: the claim scan's hint (core::ClaimScanHint) per handler, max
// and per_key. Consumers and dispatchers claim the same handlers in a loop
// and the depth a claim has to read moves slowly, so the next claim starts
// its scan there. Only a hint: correctness never depends on the window.
struct WindowHint {
  int32 handler_id;
  int max;
  int per_key;
  ScanHintData scan;
};
static WindowHint window_hints[16];

static WindowHint* window_hint(int32 handler_id, int max, int per_key) {
  WindowHint* h = &window_hints[static_cast<uint32>(handler_id) % lengthof(window_hints)];
  if (h->handler_id != handler_id || h->max != max || h->per_key != per_key) {
    *h = WindowHint{handler_id, max, per_key, {0, 0, 0}};
  }
  return h;
}

// After the fetch: which of the leased rows to hand over, in order (order[]:
// row numbers of SPI_tuptable; returns how many), and which leases go back
// (give_back[]: indices into leased_ids; give_back_row[]: their fetched row,
// -1: gone).
static int finalize(const int64* leased_ids, const bool* got, int nleased, int* order, int* give_back,
                    int* give_back_row, int* ngive) {
  int nrows = static_cast<int>(SPI_processed);
  FetchedData f;
  f.n = nrows;
  int64* ids = static_cast<int64*>(palloc(sizeof(int64) * (nrows + 1)));
  char** keys = static_cast<char**>(palloc(sizeof(char*) * (nrows + 1)));
  int64* seqs = static_cast<int64*>(palloc(sizeof(int64) * (nrows + 1)));
  bool* valid = static_cast<bool*>(palloc(sizeof(bool) * (nrows + 1)));
  for (int r = 0; r < nrows; r++) {
    bool isnull = false;
    ids[r] = DatumGetInt64(spi_col(r, 1, &isnull));
    keys[r] = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 4);
    Datum s = spi_col(r, 5, &isnull);
    seqs[r] = isnull ? 0 : DatumGetInt64(s);
    Datum v = spi_col(r, kFetchColumns + 1, &isnull);
    valid[r] = !isnull && DatumGetBool(v);
  }
  f.ids = ids;
  f.keys = keys;
  f.seqs = seqs;
  f.valid = valid;
  return scan_hand_over(leased_ids, got, nleased, &f, order, give_back, give_back_row, ngive);
}

// Every hand-over is an attempt: a scanned delivery whose lease ran out
// without completion is charged (a nack with the handler's backoff, or a dead
// letter after max_attempts) in this transaction. The charge marks the lease,
// so a concurrent claimer neither charges it again nor takes it; the lease
// goes at commit, and at abort the next claimer charges it.
static void charge_expired(const int64* expired, int n, TimestampTz now) {
  if (n == 0) return;
  bool* marked = static_cast<bool*>(palloc(sizeof(bool) * n));
  if (leases_begin_charge(expired, n, now, marked) == 0) return;
  Settlement* charged = static_cast<Settlement*>(palloc(sizeof(Settlement) * n));
  int ncharged = 0;
  for (int i = 0; i < n; i++)
    if (marked[i]) charged[ncharged++] = settlement_failed(expired[i], -1, "lease expired");
  judge_failures(charged, ncharged);
  (void)settle(charged, ncharged);
}

// The lanes a claim reads, as a bit mask (every lane: all bits).
static uint64 lane_mask(const ClaimRequest* req) {
  static_assert(kNumLanes == 64, "a lane set is one 64-bit mask");
  if (req->lanes == nullptr) return ~UINT64CONST(0);
  uint64 m = 0;
  for (int i = 0; i < req->nlanes; i++) m |= UINT64CONST(1) << (req->lanes[i] & 63);
  return m;
}

// Row `row` of the fetch, read out of SPI_tuptable (text copied, jsonb
// detoasted where it must be).
static void read_claimed(int row, ClaimedRow* out) {
  bool isnull = false;
  out->id = spi_int64(row, 1);
  out->event_id = spi_int64(row, 2);
  Datum d = spi_col(row, 3, &isnull);
  out->topic = isnull ? pstrdup("") : TextDatumGetCString(d);
  d = spi_col(row, 4, &isnull);
  out->key = isnull ? nullptr : TextDatumGetCString(d);
  d = spi_col(row, 5, &isnull);
  out->has_seq = !isnull;
  out->seq = isnull ? 0 : DatumGetInt64(d);
  d = spi_col(row, 6, &isnull);
  out->payload = isnull ? nullptr : DatumGetJsonbP(d);
  d = spi_col(row, 7, &isnull);
  out->headers = isnull ? nullptr : DatumGetJsonbP(d);
  out->attempt = DatumGetInt32(spi_col(row, 8, &isnull));
  out->priority = DatumGetInt32(spi_col(row, 9, &isnull));
  out->published_at = DatumGetTimestampTz(spi_col(row, 10, &isnull));
}

void claim_deliveries(const ClaimRequest* req, ClaimResult* out) {
  TimestampTz now = GetCurrentTimestamp();
  int64 now_ms = timestamptz_to_epoch_ms(now);
  TimestampTz until = TimestampTzPlusMilliseconds(now, req->lease_ms);
  out->n = 0;
  out->rows = nullptr;
  out->until = until;
  out->next_ready_ms = 0;

  Datum lanes = (Datum)0;
  if (req->lanes != nullptr) {
    if (req->nlanes == 0) return;
    Datum* ld = static_cast<Datum*>(palloc(sizeof(Datum) * req->nlanes));
    for (int i = 0; i < req->nlanes; i++) ld[i] = Int16GetDatum(req->lanes[i]);
    lanes = PointerGetDatum(construct_array(ld, req->nlanes, INT2OID, 2, true, TYPALIGN_SHORT));
  }

  // A claim that lost every row it planned to a concurrent claimer (their
  // leases won) looks again: the next scan sees those leases and moves on.
  for (int round = 0;; round++) {
    WindowHint* hint = window_hint(req->handler_id, req->max, req->per_key);
    // Where the scan starts. view.head: at the settled floor (claim_floor.hpp),
    // where "the head" starts; otherwise at a pull handler's frontier.
    FrontierView view = {};
    view.head = true;
    if (req->use_frontier) frontier_read(req->handler_id, now, &view);
    int64 floor[4] = {0, 0, 0, 0};
    if (req->use_floor) {
      FloorView fv;
      floor_read(req->handler_id, lane_mask(req), req->rescans, now, &fv);
      for (int p = 0; p < 4; p++) floor[p] = fv.from[p];
    } else if (req->use_frontier) {
      for (int p = 0; p < 4; p++) floor[p] = view.floor[p];
    }
    // The policy (which reads, how wide, from where) is the core's
    // (core/claim_scan.hpp); this loop only performs its reads.
    ScanConfigData cfg = {};
    cfg.max = req->max;
    cfg.per_key = req->per_key;
    cfg.now_ms = now_ms;
    cfg.aging_ms = guc_priority_aging_ms;
    cfg.scan_limit = guc_claim_scan_limit;
    cfg.from_frontier = !view.head;
    for (int p = 0; p < 4; p++) {
      cfg.frontier[p] = view.from[p];
      cfg.floor[p] = floor[p];
    }
    cfg.key_walk_filtered = lanes != (Datum)0;
    // For the floor's rule: the xmin of the last scan from the floor.
    const bool track_floor = req->use_floor || req->use_frontier;
    TransactionId xmin = InvalidTransactionId;
    ClaimScanState* scan = scan_begin(&cfg, &hint->scan);
    for (;;) {
      ScanStepData step;
      scan_next(scan, &step);
      if (step.kind == ScanStep::Done) break;
      ScannedRows rows;
      perform_read(req->handler_id, step, lanes, now, req->take_notified, view.head ? nullptr : &view, &rows,
                   track_floor && step.kind == ScanStep::Window && step.at_floor ? &xmin : nullptr);
      ScanRowsData data = {rows.n,           rows.ids,    rows.priority, rows.keys,
                           rows.ready_at_ms, rows.leased, rows.expired,  rows.key_below};
      scan_feed(scan, &data);
    }
    ScanOutcomeData oc;
    scan_outcome(scan, &oc, &hint->scan);
    out->next_ready_ms = oc.next_ready_ms;
    view.head = oc.at_floor;
    for (int p = 0; p < 4; p++) view.from[p] = oc.from[p];
    if (track_floor && view.head) {  // the last scan started at the floor
      FloorView used;
      used.head = all_zero(floor);
      for (int p = 0; p < 4; p++) used.from[p] = floor[p];
      if (req->use_floor)
        floor_note(req->handler_id, used, oc.first, oc.highest, xmin);
      else
        frontier_note_floor(req->handler_id, view, used, oc.first, oc.highest, xmin);
    }
    // What the rest of the claim needs, copied out before the scan goes.
    const int nchosen = oc.nchosen;
    int64* chosen = static_cast<int64*>(palloc(sizeof(int64) * (nchosen + 1)));
    if (nchosen > 0) memcpy(chosen, oc.chosen, sizeof(int64) * nchosen);
    int64* expired = static_cast<int64*>(palloc(sizeof(int64) * (oc.nexpired + 1)));
    if (oc.nexpired > 0) memcpy(expired, oc.expired, sizeof(int64) * oc.nexpired);
    const int nexpired = oc.nexpired;
    const bool advance = req->use_frontier && !oc.heads_added;
    int64 upto[4];
    for (int p = 0; p < 4; p++) upto[p] = oc.upto[p];
    FrontierPassed* passed = static_cast<FrontierPassed*>(palloc(sizeof(FrontierPassed) * (oc.npassed + 1)));
    const int npassed = advance ? oc.npassed : 0;
    for (int i = 0; i < npassed; i++)
      passed[i] = FrontierPassed{oc.passed[i].id, oc.passed[i].priority, frontier_key_hash(oc.passed[i].key)};
    scan_end(scan);

    charge_expired(expired, nexpired, now);
    if (nchosen == 0) return;

    bool* got = static_cast<bool*>(palloc(sizeof(bool) * nchosen));
    LeaseToken* tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * nchosen));
    int taken = leases_acquire(chosen, nchosen, req->handler_id, req->kind, now, until, req->take_notified,
                               XactReadOnly, got, tokens);
    // Before the fetch: a concurrent claimer (or this one's next round)
    // starts past these leases at once.
    if (advance) frontier_advance(req->handler_id, view, upto, passed, npassed, now);
    if (taken == 0) {
      if (round < 2) continue;
      return;
    }
    Datum* id_datums = static_cast<Datum*>(palloc(sizeof(Datum) * nchosen));
    for (int i = 0; i < nchosen; i++) id_datums[i] = Int64GetDatum(chosen[i]);
    Datum values[3] = {
        PointerGetDatum(construct_array(id_datums, nchosen, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE)),
        Int32GetDatum(req->handler_id), TimestampTzGetDatum(now)};
    spi_exec_latest(&fetch_plan, values, nullptr, true, 0);

    int* order = static_cast<int*>(palloc(sizeof(int) * (nchosen + 1)));
    int* give_back = static_cast<int*>(palloc(sizeof(int) * (nchosen + 1)));
    int* give_back_row = static_cast<int*>(palloc(sizeof(int) * (nchosen + 1)));
    int ngive = 0;
    int nout = finalize(chosen, got, nchosen, order, give_back, give_back_row, &ngive);

    // Leases taken for rows that are not handed over go back at once.
    int64* give_ids = static_cast<int64*>(palloc(sizeof(int64) * (ngive + 1)));
    LeaseToken* give_tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * (ngive + 1)));
    for (int i = 0; i < ngive; i++) {
      give_ids[i] = chosen[give_back[i]];
      give_tokens[i] = tokens[give_back[i]];
    }
    leases_release(give_ids, give_tokens, ngive);
    int fetched = static_cast<int>(SPI_processed);
    // Rows given back that are still there (not ready, or behind their
    // key's head) are claimable again below the frontier, and an earlier
    // row of their key may be below it, unseen by scans from it.
    bool noted_key = false;
    if (req->use_frontier)
      for (int i = 0; i < ngive; i++) {
        if (give_back_row[i] < 0) continue;
        frontier_lower(req->handler_id, give_ids[i]);
        char* key = SPI_getvalue(SPI_tuptable->vals[give_back_row[i]], SPI_tuptable->tupdesc, 4);
        if (key != nullptr) {
          frontier_note_key(req->handler_id, frontier_key_hash(key));
          noted_key = true;
        }
      }
    // Nothing left: rows lost to a concurrent claimer, gone (acked after
    // this claim's scan, before its lease lookup), or behind an earlier
    // row of their key that the scan did not see: look again.
    if (nout == 0 && (taken < nchosen || fetched < taken || noted_key) && round < 2) continue;
    // The receipts in hand-over order.
    IdToken* by_id = static_cast<IdToken*>(palloc(sizeof(IdToken) * nchosen));
    for (int i = 0; i < nchosen; i++) by_id[i] = IdToken{chosen[i], tokens[i]};
    qsort(by_id, nchosen, sizeof(IdToken), cmp_int64);  // id is the first member
    ClaimedRow* claimed = static_cast<ClaimedRow*>(palloc(sizeof(ClaimedRow) * (nout + 1)));
    for (int i = 0; i < nout; i++) {
      read_claimed(order[i], &claimed[i]);
      auto* hit = static_cast<IdToken*>(bsearch(&claimed[i].id, by_id, nchosen, sizeof(IdToken), cmp_int64));
      claimed[i].token = hit->token;  // every handed-over row was leased by this claim
    }
    out->n = nout;
    out->rows = claimed;
    return;
  }
}

}  // namespace relaybus::pg

using namespace relaybus;
using namespace relaybus::pg;

extern "C" Datum relay_claim(PG_FUNCTION_ARGS) {
  refuse_during_recovery("relay_claim()");
  if (PG_ARGISNULL(0)) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("handler must not be NULL")));
  char* name = text_arg(fcinfo, 0, nullptr);
  if (PG_ARGISNULL(1))
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("max must be between 1 and 10000, not NULL")));
  int max = PG_GETARG_INT32(1);
  if (max < 1 || max > 10000)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("max must be between 1 and 10000, not %d", max)));
  int per_key = PG_ARGISNULL(3) ? 1 : PG_GETARG_INT32(3);
  if (per_key < 1 || per_key > 10000)
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("per_key must be between 1 and 10000, not %d", per_key)));

  const HandlerEntry* h = catalog_handler_by_name(name);
  if (h == nullptr) ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT), errmsg("handler \"%s\" does not exist", name)));
  // An ack-mode notify handler may be claimed too: a LISTEN consumer drains
  // what is pending when it starts, taking over NOTIFYs nobody acked.
  bool notify_ack = h->kind == core::HandlerKind::Notify && h->ack;
  if (h->kind != core::HandlerKind::Pull && !notify_ack)
    ereport(ERROR, (errcode(ERRCODE_WRONG_OBJECT_TYPE),
                    errmsg("handler \"%s\" is not a pull handler or an ack-mode notify handler", name),
                    errdetail("%s", h->kind == core::HandlerKind::Notify
                                        ? "It is a fire-and-forget notify handler: its deliveries complete when sent."
                                        : psprintf("It is a %s handler; its deliveries are handed over by the "
                                                   "background workers.",
                                                   core::handler_kind_name(h->kind)))));
  ClaimRequest req = {};
  req.kind = LeaseKind::Claim;
  req.take_notified = notify_ack;
  req.use_frontier = h->kind == core::HandlerKind::Pull;
  req.handler_id = h->id;
  req.max = max;
  req.per_key = per_key;
  req.lease_ms = h->lease_ms;
  if (!PG_ARGISNULL(2)) {
    req.lease_ms = interval_to_ms(PG_GETARG_INTERVAL_P(2));
    if (req.lease_ms < 1000 || req.lease_ms > 86400000LL)
      ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("lease must be between 1 second and 1 day")));
  }

  InitMaterializedSRF(fcinfo, 0);
  // A paused handler hands nothing over: its consumers poll on until
  // relay_resume_handler (docs/operations.md).
  if (h->paused) return (Datum)0;
  auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  SpiScope scope;
  spi_begin(&scope);
  ClaimResult res;
  claim_deliveries(&req, &res);
  // 0.1.0's relay_claim has no lease column: a server may run this library
  // before ALTER EXTENSION relaybus UPDATE.
  constexpr int kColumns = 13;  // id .. published_at, lease_until, lease, traceparent
  bool with_lease = rsinfo->setDesc->natts >= 12;
  // 0.2.0's has no traceparent column (the same reason).
  bool with_trace = rsinfo->setDesc->natts >= kColumns;
  for (int i = 0; i < res.n; i++) {
    const ClaimedRow& r = res.rows[i];
    Datum out[kColumns];
    bool nulls[kColumns] = {};
    out[0] = Int64GetDatum(r.id);
    out[1] = Int64GetDatum(r.event_id);
    out[2] = CStringGetTextDatum(r.topic);
    nulls[3] = r.key == nullptr;
    out[3] = r.key != nullptr ? CStringGetTextDatum(r.key) : (Datum)0;
    nulls[4] = !r.has_seq;
    out[4] = Int64GetDatum(r.seq);
    nulls[5] = r.payload == nullptr;
    out[5] = JsonbPGetDatum(r.payload);
    nulls[6] = r.headers == nullptr;
    out[6] = JsonbPGetDatum(r.headers);
    out[7] = Int32GetDatum(r.attempt);
    out[8] = Int32GetDatum(r.priority);
    out[9] = TimestampTzGetDatum(r.published_at);
    out[10] = TimestampTzGetDatum(res.until);
    if (with_lease) {
      auto* token = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken)));
      *token = r.token;
      out[11] = UUIDPGetDatum(token);
    }
    if (with_trace) {
      char* traceparent = handover_traceparent(r.headers);
      nulls[12] = traceparent == nullptr;
      out[12] = traceparent == nullptr ? (Datum)0 : CStringGetTextDatum(traceparent);
    }
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, nulls);
  }
  spi_end(&scope);
  return (Datum)0;
}
