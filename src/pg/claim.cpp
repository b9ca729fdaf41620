// relay_claim: lease ready deliveries of a pull handler and return them.
//
// 1. Scan: read a window of the oldest rows of each priority class (one
//    statement, four index ranges) with a fresh snapshot.
// 2. Plan (core): merge the classes by aged priority, take keys' heads (and up
//    to per_key of a key's run), skip keys whose head is leased or not ready.
// 3. Charge the scanned deliveries whose lease expired a failed attempt (once
//    per expiry: the charge marks the lease), then lease the chosen ids in
//    shared memory with fresh tokens (no row is written).
// 4. Fetch them again with a snapshot taken after leasing and keep only rows
//    that are still there, ready, and whose earlier deliveries of the key are
//    gone or in this claim. This is the fence against a concurrent ack/nack that
//    the first snapshot did not see.

#include <algorithm>
#include <array>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/claim_planner.hpp"
#include "pg/boundary.hpp"
#include "pg/settle.hpp"
#include "pg/catalog_cache.hpp"
#include "pg/claim.hpp"
#include "pg/claim_floor.hpp"
#include "pg/claim_frontier.hpp"
#include "pg/guard.hpp"
#include "pg/leases.hpp"
#include "pg/pg_includes.hpp"
#include "pg/recovery_guard.hpp"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"

extern "C" {
PG_FUNCTION_INFO_V1(relay_claim);
}

namespace relaybus::pg {

// Every statement here runs with PlanShape::IndexScans (no sequential or
// bitmap scan, no sort: plan_settings.hpp) and is written so that exactly one
// index returns its rows in the order it asks for; that index scan is its only
// plan, whatever the statistics. A class is a range on priority, not an
// equality, and is ordered by (priority, id): deliveries_claim returns that
// order, while deliveries_pkey (id order, with a filter) would need a sort.
#define CLASS_SCAN(p, lanes)                                                          \
    "(SELECT id, priority, key, not_before FROM relay.deliveries"                     \
    " WHERE handler_id = $1 AND priority >= " #p " AND priority <= " #p lanes          \
    " ORDER BY priority, id LIMIT $2)"
#define ALL_CLASSES(lanes)                                                                  \
    "SELECT id, priority, key, not_before FROM (" CLASS_SCAN(3, lanes) " UNION ALL "        \
    CLASS_SCAN(2, lanes) " UNION ALL " CLASS_SCAN(1, lanes) " UNION ALL " CLASS_SCAN(0, lanes) ") s"

static SavedPlan scan_plan = {ALL_CLASSES(""), 2, {INT4OID, INT4OID}, nullptr, PlanShape::IndexScans};
static SavedPlan scan_lanes_plan = {ALL_CLASSES(" AND lane = ANY ($3)"), 3,
                                    {INT4OID, INT4OID, INT2ARRAYOID}, nullptr, PlanShape::IndexScans};
// relay_claim of a busy pull handler starts each class at its frontier
// (claim_frontier.hpp), a dispatcher at its floor (claim_floor.hpp): `id >= $n`
// after `priority >= p` positions the index descent there, past the rows in
// flight and the entries of completed ones.
#define FROM_CLASSES(lanes)                                                                             \
    "SELECT id, priority, key, not_before FROM (" CLASS_SCAN(3, " AND id >= $3" lanes) " UNION ALL "       \
    CLASS_SCAN(2, " AND id >= $4" lanes) " UNION ALL " CLASS_SCAN(1, " AND id >= $5" lanes) " UNION ALL "   \
    CLASS_SCAN(0, " AND id >= $6" lanes) ") s"
static SavedPlan scan_from_plan = {FROM_CLASSES(""), 6, {INT4OID, INT4OID, INT8OID, INT8OID, INT8OID, INT8OID},
                                   nullptr, PlanShape::IndexScans};
static SavedPlan scan_from_lanes_plan = {FROM_CLASSES(" AND lane = ANY ($7)"), 7,
                                         {INT4OID, INT4OID, INT8OID, INT8OID, INT8OID, INT8OID, INT2ARRAYOID},
                                         nullptr, PlanShape::IndexScans};

// Key heads: the first per_key deliveries (by seq) of up to $2 keys, found by
// walking deliveries_key one key at a time (one index descent per key) instead
// of reading every row of the keys' runs in id order. Used when a claim's
// window is full of a few keys' runs (hot keys): see claim_deliveries.
#define KEY_HEADS(lanes)                                                                          \
    "WITH RECURSIVE k(key) AS ("                                                                  \
    "  (SELECT key FROM relay.deliveries WHERE handler_id = $1 AND key IS NOT NULL"               \
    "    ORDER BY key LIMIT 1)"                                                                   \
    "  UNION ALL"                                                                                 \
    "  SELECT (SELECT x.key FROM relay.deliveries x WHERE x.handler_id = $1 AND x.key > k.key"    \
    "           ORDER BY x.key LIMIT 1) FROM k WHERE k.key IS NOT NULL)"                          \
    " SELECT r.id, r.priority, r.key, r.not_before"                                              \
    "   FROM (SELECT k.key FROM k WHERE k.key IS NOT NULL LIMIT $2) kk,"                          \
    "   LATERAL (SELECT id, priority, key, not_before FROM relay.deliveries"                      \
    "             WHERE handler_id = $1 AND key = kk.key" lanes " ORDER BY seq LIMIT $3) r"
static SavedPlan heads_plan = {KEY_HEADS(""), 3, {INT4OID, INT4OID, INT4OID}, nullptr, PlanShape::IndexScans};
static SavedPlan heads_lanes_plan = {KEY_HEADS(" AND lane = ANY ($4)"), 4,
                                     {INT4OID, INT4OID, INT4OID, INT2ARRAYOID}, nullptr, PlanShape::IndexScans};

// The first per_key deliveries (by seq) of the keys $2: for a scan from the
// claim frontier, the keys whose earlier rows may lie below it, where the scan
// does not see them (claim_frontier.hpp). One index descent per key.
#define HEADS_OF_KEYS                                                                            \
    "SELECT r.id, r.priority, r.key, r.not_before FROM unnest($2::text[]) kk(key),"              \
    " LATERAL (SELECT id, priority, key, not_before FROM relay.deliveries"                       \
    "           WHERE handler_id = $1 AND key = kk.key ORDER BY seq LIMIT $3) r"
static SavedPlan heads_of_keys_plan = {HEADS_OF_KEYS, 3, {INT4OID, TEXTARRAYOID, INT4OID}, nullptr,
                                       PlanShape::IndexScans};

// A keyed row is valid only if every delivery of its (handler, key) up to the
// highest seq taken is in this claim: the head and no gap. One count per key
// (an index range on deliveries_key), not one probe per row.
//
// The fetch finds its rows by primary key only: `handler_id + 0` keeps the
// planner from reading the handler's whole backlog through deliveries_claim
// and filtering the ids (a custom plan did that with stale statistics: 36,000
// rows read for 100 fetched). The count of a key's rows is taken over rows in
// seq order, which only deliveries_key returns without a sort.
#define FETCH_WITH                                                                               \
    "WITH d AS MATERIALIZED (SELECT * FROM relay.deliveries x"                                    \
    "                         WHERE x.id = ANY ($1) AND x.handler_id + 0 = $2),"                  \
    " k AS (SELECT d.key, max(d.seq) AS hi, count(*) AS n FROM d WHERE d.key IS NOT NULL"       \
    "       GROUP BY d.key),"                                                                     \
    " whole AS (SELECT k.key FROM k WHERE (SELECT count(*) FROM (SELECT FROM relay.deliveries p"  \
    "             WHERE p.handler_id = $2 AND p.key = k.key AND p.seq <= k.hi"                    \
    "             ORDER BY p.seq) run) = k.n) "
#define FETCH_COLUMNS                                                                          \
    FETCH_WITH                                                                                 \
    "SELECT d.id, d.event_id, coalesce(d.wire_topic, d.topic) AS topic, d.key, d.seq, d.payload," \
    "       d.headers, d.attempt + 1, d.priority::int4, d.published_at,"                       \
    "       (d.not_before <= $3 AND (d.key IS NULL OR d.key IN (SELECT w.key FROM whole w))) AS valid"
#define FETCH_FROM " FROM d"

// The fetch's columns (1-based): id, event_id, topic, key, seq, payload,
// headers, attempt, priority, published_at, then valid.
constexpr int kFetchColumns = 10;

static SavedPlan fetch_plan = {FETCH_COLUMNS FETCH_FROM, 3, {INT8ARRAYOID, INT4OID, TIMESTAMPTZOID}, nullptr,
                               PlanShape::IndexScans};



static int cmp_int64(const void* a, const void* b) {
    int64 x = *static_cast<const int64*>(a), y = *static_cast<const int64*>(b);
    return x < y ? -1 : (x > y ? 1 : 0);
}

struct IdRow {
    int64 id;  // first: sorted and searched with cmp_int64
    int row;
};

struct IdToken {
    int64 id;  // first: sorted and searched with cmp_int64
    LeaseToken token;
};

struct ScannedRows {
    int n;
    int nwindow;  // the first nwindow rows came from the scan itself, the others were added
    int64* ids;
    int* priority;
    char** keys;  // nullptr = unkeyed
    int64* ready_at_ms;
    bool* leased;
    bool* expired;  // leased, and the lease ran out without completion
    bool truncated[4];
    bool merged = false;  // key heads appended: streams need sorting by id
};

// Reads the rows of SPI_tuptable (id, priority, key, not_before) into out.
static void read_scanned(int window, TimestampTz now, bool take_notified, ScannedRows* out) {
    int n = static_cast<int>(SPI_processed);
    out->n = n;
    out->nwindow = n;
    out->ids = static_cast<int64*>(palloc(sizeof(int64) * (n + 1)));
    out->priority = static_cast<int*>(palloc(sizeof(int) * (n + 1)));
    out->keys = static_cast<char**>(palloc(sizeof(char*) * (n + 1)));
    out->ready_at_ms = static_cast<int64*>(palloc(sizeof(int64) * (n + 1)));
    out->leased = static_cast<bool*>(palloc(sizeof(bool) * (n + 1)));
    out->expired = static_cast<bool*>(palloc(sizeof(bool) * (n + 1)));
    int per_class[4] = {0, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        bool isnull = false;
        out->ids[i] = DatumGetInt64(spi_col(i, 1, &isnull));
        out->priority[i] = DatumGetInt16(spi_col(i, 2, &isnull));
        out->keys[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3);
        out->ready_at_ms[i] = timestamptz_to_epoch_ms(DatumGetTimestampTz(spi_col(i, 4, &isnull)));
        if (out->priority[i] >= 0 && out->priority[i] <= 3) per_class[out->priority[i]]++;
    }
    for (int p = 0; p < 4; p++) out->truncated[p] = per_class[p] >= window;
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

// from: per class the first id to read (nullptr: from the head). xmin: the
// xmin of the scan's snapshot (when not nullptr).
static void scan(int32 handler_id, int window, Datum lanes, const int64* from, TimestampTz now,
                 bool take_notified, ScannedRows* out, TransactionId* xmin) {
    if (from != nullptr) {
        Datum values[7] = {Int32GetDatum(handler_id), Int32GetDatum(window), Int64GetDatum(from[3]),
                           Int64GetDatum(from[2]),    Int64GetDatum(from[1]), Int64GetDatum(from[0]),
                           lanes};
        spi_exec_latest(lanes == (Datum)0 ? &scan_from_plan : &scan_from_lanes_plan, values, nullptr, true, 0, xmin);
    } else {
        Datum values[3] = {Int32GetDatum(handler_id), Int32GetDatum(window), lanes};
        spi_exec_latest(lanes == (Datum)0 ? &scan_plan : &scan_lanes_plan, values, nullptr, true, 0, xmin);
    }
    read_scanned(window, now, take_notified, out);
}

// The heads of up to max_keys keys (per_key rows each) into heads. Returns
// true if the walk may have stopped before the last key (more keys may exist;
// with lanes the walk also passes keys of other lanes, so it cannot tell).
static bool key_heads(int32 handler_id, int max_keys, int per_key, Datum lanes, TimestampTz now,
                      bool take_notified, ScannedRows* heads) {
    Datum values[4] = {Int32GetDatum(handler_id), Int32GetDatum(max_keys), Int32GetDatum(per_key), lanes};
    spi_exec_latest(lanes == (Datum)0 ? &heads_plan : &heads_lanes_plan, values, nullptr, true, 0);
    read_scanned(INT_MAX, now, take_notified, heads);
    if (lanes != (Datum)0) return true;
    int nkeys = 0;  // rows come key by key
    for (int i = 0; i < heads->n; i++)
        if (i == 0 || strcmp(heads->keys[i], heads->keys[i - 1]) != 0) nkeys++;
    return nkeys >= max_keys;
}

template <typename T>
static T* concat(const T* a, int na, const T* b, int nb) {
    T* out = static_cast<T*>(palloc(sizeof(T) * (na + nb + 1)));
    if (na > 0) memcpy(out, a, sizeof(T) * na);
    if (nb > 0) memcpy(out + na, b, sizeof(T) * nb);
    return out;
}

// Appends heads to a window's rows (the truncation flags stay the window's).
static void add_rows(ScannedRows* rows, const ScannedRows& heads) {
    rows->ids = concat(rows->ids, rows->n, heads.ids, heads.n);
    rows->priority = concat(rows->priority, rows->n, heads.priority, heads.n);
    rows->keys = concat(rows->keys, rows->n, heads.keys, heads.n);
    rows->ready_at_ms = concat(rows->ready_at_ms, rows->n, heads.ready_at_ms, heads.n);
    rows->leased = concat(rows->leased, rows->n, heads.leased, heads.n);
    rows->expired = concat(rows->expired, rows->n, heads.expired, heads.n);
    rows->n += heads.n;
    rows->merged = true;
}

// Keys whose first rows a claim read because they may be blocked below the
// frontier, and those rows.
struct ProbedKeys {
    static constexpr int kMax = 64;  // per claim; rows of further keys are left to the fence
    int nkeys = 0;
    const char* keys[kMax];
    bool any = false;
    ScannedRows heads;
};

// For a scan from the frontier: reads the first rows of the window's keys
// that the frontier says may be blocked below it and were not read yet.
static void probe_keys(int32 handler_id, int per_key, const FrontierView& view, const ScannedRows& rows,
                       TimestampTz now, bool take_notified, ProbedKeys* probed) {
    if (view.head || view.nkeys == 0 || probed->nkeys >= ProbedKeys::kMax) return;
    Datum* fresh = static_cast<Datum*>(palloc(sizeof(Datum) * ProbedKeys::kMax));
    int nfresh = 0;
    for (int i = 0; i < rows.nwindow && probed->nkeys < ProbedKeys::kMax; i++) {
        const char* key = rows.keys[i];
        if (key == nullptr || !frontier_view_has_key(view, frontier_key_hash(key))) continue;
        bool seen = false;
        for (int k = 0; k < probed->nkeys && !seen; k++) seen = strcmp(probed->keys[k], key) == 0;
        if (seen) continue;
        probed->keys[probed->nkeys++] = key;
        fresh[nfresh++] = CStringGetTextDatum(key);
    }
    if (nfresh == 0) return;
    Datum values[3] = {Int32GetDatum(handler_id),
                       PointerGetDatum(construct_array(fresh, nfresh, TEXTOID, -1, false, TYPALIGN_INT)),
                       Int32GetDatum(per_key)};
    spi_exec_latest(&heads_of_keys_plan, values, nullptr, true, 0);
    ScannedRows got;
    read_scanned(INT_MAX, now, take_notified, &got);
    if (probed->any) {
        add_rows(&probed->heads, got);
    } else {
        probed->heads = got;
        probed->any = true;
    }
}

// Per backend: how many rows per class the last claim of a handler needed to
// read. Consumers and dispatchers claim the same handlers in a loop and that
// depth (rows leased by others, keys over per_key ahead of ready rows) moves
// slowly, so the next claim starts its scan there instead of at 4 x max: an
// unkeyed consumer reads about one row per row it gets, and a claim that had
// to widen last time does not repeat the narrow scans. Only a hint: a short
// window still widens, and correctness never depends on the window.
struct WindowHint {
    int32 handler_id;
    int max;
    int per_key;
    int window;  // 0 = none
    int window_front;  // the same for scans from the frontier (0 = none)
    uint32 claims;
};
static WindowHint window_hints[16];

static WindowHint* window_hint(int32 handler_id, int max, int per_key) {
    WindowHint* h = &window_hints[static_cast<uint32>(handler_id) % lengthof(window_hints)];
    if (h->handler_id != handler_id || h->max != max || h->per_key != per_key) {
        *h = WindowHint{handler_id, max, per_key, 0, 0, 0};
    }
    return h;
}

// What the core's plan says besides the chosen ids (see core::ClaimPlan).
struct PlanStats {
    bool may_have_more;
    int64 rows_needed;
    int64 distinct_keys;
    int64 keyed_rows;
    int64 unkeyed_rows;
};

// The core's plan for the scanned rows: chosen ids into `chosen`, returns count.
static int plan(const ScannedRows& rows, int max, int per_key, int64 now_ms, PlanStats* stats,
                int64* chosen) {
    int count = 0;
    char err[kErrLen];
    bool ok = run_core(
        [&](std::string*) {
            std::array<std::vector<core::ClaimRow>, 4> streams;
            for (int i = 0; i < rows.n; i++) {
                int p = std::clamp(rows.priority[i], 0, 3);
                core::ClaimRow r;
                r.id = rows.ids[i];
                r.priority = p;
                r.has_key = rows.keys[i] != nullptr;
                if (r.has_key) r.key = rows.keys[i];
                r.ready_at_ms = rows.ready_at_ms[i];
                r.leased = rows.leased[i];
                streams[p].push_back(std::move(r));
            }
            if (rows.merged)
                for (auto& st : streams)
                    std::sort(st.begin(), st.end(),
                              [](const core::ClaimRow& a, const core::ClaimRow& b) { return a.id < b.id; });
            std::array<bool, 4> truncated = {rows.truncated[0], rows.truncated[1],
                                             rows.truncated[2], rows.truncated[3]};
            core::ClaimLimits lim;
            lim.max = max;
            lim.per_key = per_key;
            core::ClaimPlan result =
                core::plan_claim(streams, truncated, lim, now_ms, guc_priority_aging_ms);
            *stats = PlanStats{result.may_have_more, result.rows_needed, result.distinct_keys,
                               result.keyed_rows, result.unkeyed_rows};
            for (int64_t id : result.ids) {
                if (count >= max) break;
                chosen[count++] = id;
            }
            return true;
        },
        err);
    if (!ok) ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("relaybus claim planning failed: %s", err)));
    return count;
}

// After the fetch: which of the leased rows to hand over, in order. Fills
// order[] with row numbers of SPI_tuptable; returns how many.
static int finalize(const int64* leased_ids, const bool* got, int nleased, int* order) {
    int nrows = static_cast<int>(SPI_processed);
    // Row data needed by the core, copied out of SPI first.
    int64* row_id = static_cast<int64*>(palloc(sizeof(int64) * (nrows + 1)));
    char** row_key = static_cast<char**>(palloc(sizeof(char*) * (nrows + 1)));
    int64* row_seq = static_cast<int64*>(palloc(sizeof(int64) * (nrows + 1)));
    bool* row_valid = static_cast<bool*>(palloc(sizeof(bool) * (nrows + 1)));
    for (int r = 0; r < nrows; r++) {
        bool isnull = false;
        row_id[r] = DatumGetInt64(spi_col(r, 1, &isnull));
        row_key[r] = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 4);
        Datum s = spi_col(r, 5, &isnull);
        row_seq[r] = isnull ? 0 : DatumGetInt64(s);
        Datum v = spi_col(r, kFetchColumns + 1, &isnull);
        row_valid[r] = !isnull && DatumGetBool(v);
    }
    int count = 0;
    char err[kErrLen];
    bool ok = run_core(
        [&](std::string*) {
            std::unordered_map<int64_t, int> row_of;
            for (int r = 0; r < nrows; r++) row_of[row_id[r]] = r;
            // Keys of rows we could not lease are known only from the plan; a
            // lost lease invalidates its key for the rest of this claim.
            std::vector<core::CheckedRow> checked;
            checked.reserve(nleased);
            for (int i = 0; i < nleased; i++) {
                auto it = row_of.find(leased_ids[i]);
                core::CheckedRow c;
                c.id = leased_ids[i];
                c.present = it != row_of.end();
                c.has_key = c.present && row_key[it->second] != nullptr;
                if (c.has_key) c.key = row_key[it->second];
                c.valid = c.present && got[i] && row_valid[it->second];
                checked.push_back(std::move(c));
            }
            std::vector<int64_t> final_ids = core::finalize_claim(checked);
            // Hand-over order: keys in the order they were chosen, each key by seq.
            std::unordered_map<std::string, int> key_rank;
            struct Out {
                int rank;
                int64 seq;
                int pos;
                int row;
            };
            std::vector<Out> outs;
            for (size_t i = 0; i < final_ids.size(); i++) {
                int r = row_of.at(final_ids[i]);
                int rank = static_cast<int>(i);
                if (row_key[r] != nullptr) rank = key_rank.emplace(row_key[r], static_cast<int>(i)).first->second;
                outs.push_back(Out{rank, row_seq[r], static_cast<int>(i), r});
            }
            std::stable_sort(outs.begin(), outs.end(), [](const Out& a, const Out& b) {
                if (a.rank != b.rank) return a.rank < b.rank;
                return a.seq < b.seq;
            });
            for (const Out& o : outs) order[count++] = o.row;
            return true;
        },
        err);
    if (!ok) ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("relaybus claim check failed: %s", err)));
    return count;
}

// Every hand-over is an attempt: a scanned delivery whose lease ran out
// without completion is charged (a nack with the handler's backoff, or a dead
// letter after max_attempts) in this transaction. The charge marks the lease,
// so a concurrent claimer neither charges it again nor takes it; the lease
// goes at commit, and at abort the next claimer charges it.
static void charge_expired(const ScannedRows& rows, TimestampTz now) {
    int n = 0;
    for (int i = 0; i < rows.n; i++)
        if (rows.expired[i]) n++;
    if (n == 0) return;
    int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
    bool* marked = static_cast<bool*>(palloc(sizeof(bool) * n));
    int k = 0;
    for (int i = 0; i < rows.n; i++)
        if (rows.expired[i]) ids[k++] = rows.ids[i];
    if (leases_begin_charge(ids, n, now, marked) == 0) return;
    Settlement* charged = static_cast<Settlement*>(palloc(sizeof(Settlement) * n));
    int ncharged = 0;
    for (int i = 0; i < n; i++)
        if (marked[i]) charged[ncharged++] = {ids[i], SettleOutcome::Retry, -1, "lease expired", 0, false, 0};
    judge_failures(charged, ncharged);
    (void)settle(charged, ncharged);
}

struct KeyedRow {
    const char* key;
    int64 id;
    int priority;
    bool passed;
};

static int cmp_keyed_row(const void* a, const void* b) {
    auto* x = static_cast<const KeyedRow*>(a);
    auto* y = static_cast<const KeyedRow*>(b);
    int c = strcmp(x->key, y->key);
    if (c != 0) return c;
    return x->id < y->id ? -1 : (x->id > y->id ? 1 : 0);
}

// After leasing: per class, every scanned row below the first one that was
// free and not chosen (not ready, behind its key's head, an expired lease
// being charged) was taken by this claim or held by another; past the last
// scanned row nothing was seen. The frontier may move up to there.
static void advance_frontier(int32 handler_id, const FrontierView& view, const ScannedRows& rows,
                             const int64* chosen, int nchosen, TimestampTz now) {
    int64* sorted = static_cast<int64*>(palloc(sizeof(int64) * (nchosen + 1)));
    memcpy(sorted, chosen, sizeof(int64) * nchosen);
    qsort(sorted, nchosen, sizeof(int64), cmp_int64);
    int64 first_free[4] = {PG_INT64_MAX, PG_INT64_MAX, PG_INT64_MAX, PG_INT64_MAX};
    int64 last[4] = {-1, -1, -1, -1};
    KeyedRow* keyed = static_cast<KeyedRow*>(palloc(sizeof(KeyedRow) * (rows.nwindow + 1)));
    int nkeyed = 0;
    // Rows added to the window (keys' first rows) may lie below the frontier:
    // only the window says what lies ahead of it.
    for (int i = 0; i < rows.nwindow; i++) {
        int p = std::clamp(rows.priority[i], 0, 3);
        last[p] = std::max(last[p], rows.ids[i]);
        // Chosen and lost to a concurrent claimer counts as held.
        bool passed = (rows.leased[i] && !rows.expired[i]) ||
                      bsearch(&rows.ids[i], sorted, nchosen, sizeof(int64), cmp_int64) != nullptr;
        if (!passed) first_free[p] = std::min(first_free[p], rows.ids[i]);
        if (rows.keys[i] != nullptr) keyed[nkeyed++] = KeyedRow{rows.keys[i], rows.ids[i], p, passed};
    }
    int64 upto[4];
    for (int p = 0; p < 4; p++)
        upto[p] = last[p] < 0 ? view.from[p] : std::min(first_free[p], last[p] + 1);
    // A passed keyed row with a later row of its key that is not passed: once
    // the frontier is past it, that later row must not look like a head.
    qsort(keyed, nkeyed, sizeof(KeyedRow), cmp_keyed_row);
    FrontierPassed* passed = static_cast<FrontierPassed*>(palloc(sizeof(FrontierPassed) * (nkeyed + 1)));
    int npassed = 0;
    for (int g = 0; g < nkeyed;) {
        int end = g;
        int64 last_free = -1;
        while (end < nkeyed && strcmp(keyed[end].key, keyed[g].key) == 0) {
            if (!keyed[end].passed) last_free = keyed[end].id;
            end++;
        }
        if (last_free >= 0) {
            uint64 hash = frontier_key_hash(keyed[g].key);
            for (int i = g; i < end && keyed[i].id < last_free; i++)
                if (keyed[i].passed) passed[npassed++] = FrontierPassed{keyed[i].id, keyed[i].priority, hash};
        }
        g = end;
    }
    qsort(passed, npassed, sizeof(FrontierPassed), cmp_int64);  // id is the first member
    frontier_advance(handler_id, view, upto, passed, npassed, now);
}

// The lanes a claim reads, as a bit mask (every lane: all bits).
static uint64 lane_mask(const ClaimRequest* req) {
    static_assert(kNumLanes == 64, "a lane set is one 64-bit mask");
    if (req->lanes == nullptr) return ~UINT64CONST(0);
    uint64 m = 0;
    for (int i = 0; i < req->nlanes; i++) m |= UINT64CONST(1) << (req->lanes[i] & 63);
    return m;
}

// Per class: the first and highest id a window scan returned (-1: none).
static void window_bounds(const ScannedRows& rows, int64 first[4], int64 highest[4]) {
    for (int p = 0; p < 4; p++) first[p] = highest[p] = -1;
    for (int i = 0; i < rows.n; i++) {
        int p = std::clamp(rows.priority[i], 0, 3);
        if (first[p] < 0 || rows.ids[i] < first[p]) first[p] = rows.ids[i];
        highest[p] = std::max(highest[p], rows.ids[i]);
    }
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
    const int max = req->max;

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
        // Widen the window (x4) while the plan is short and a class may hold more.
        const int cap = guc_claim_scan_limit / 4 + 1;
        WindowHint* hint = window_hint(req->handler_id, max, req->per_key);
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
        if (view.head)
            for (int p = 0; p < 4; p++) view.from[p] = floor[p];
        // For the floor's rule: what the last scan from the floor returned, and
        // the xmin of its snapshot.
        const bool track_floor = req->use_floor || req->use_frontier;
        TransactionId xmin = InvalidTransactionId;
        int64 first[4] = {-1, -1, -1, -1};
        int64 highest[4] = {-1, -1, -1, -1};
        int64* chosen = static_cast<int64*>(palloc(sizeof(int64) * (max + 1)));
        int nchosen = 0;
        int64 rows_needed = 0;
        bool heads_added = false;
        bool more_keys = false;
        ScannedRows heads;
        ScannedRows rows;
        ProbedKeys probed;
        for (;;) {  // from the frontier, then (when that came back short) from the head
            int& hinted = view.head ? hint->window : hint->window_front;
            int window = hinted > 0 ? std::min(hinted, cap)
                                    : std::max(64, std::min(max * 4, guc_claim_scan_limit / 4));
            heads_added = more_keys = false;
            bool exhausted = false;  // every row ahead was seen
            for (;;) {
                bool at_head = std::all_of(view.from, view.from + 4, [](int64 f) { return f == 0; });
                scan(req->handler_id, window, lanes, at_head ? nullptr : view.from, now, req->take_notified, &rows,
                     track_floor && view.head ? &xmin : nullptr);
                if (track_floor && view.head) window_bounds(rows, first, highest);
                // From the frontier: the keys' rows below it that block them.
                probe_keys(req->handler_id, req->per_key, view, rows, now, req->take_notified, &probed);
                if (probed.any) add_rows(&rows, probed.heads);
                if (heads_added) add_rows(&rows, heads);
                out->next_ready_ms = 0;
                for (int i = 0; i < rows.n; i++)
                    if (rows.ready_at_ms[i] >= now_ms && !rows.leased[i] &&
                        (out->next_ready_ms == 0 || rows.ready_at_ms[i] < out->next_ready_ms))
                        out->next_ready_ms = rows.ready_at_ms[i];
                PlanStats st;
                nchosen = plan(rows, max, req->per_key, now_ms, &st, chosen);
                rows_needed = st.rows_needed;
                exhausted = !st.may_have_more;
                if (nchosen >= max || !st.may_have_more) break;
                // Short, and a few keys' runs fill the window (hot keys: 4 or more
                // rows per key): behind a key's first per_key rows its run is of
                // no use to this claim, and a wider window would mostly read more
                // of it. Add the heads of the keys instead (one index descent per
                // key) and plan again over both.
                if (!heads_added && st.distinct_keys > 0 && st.keyed_rows >= 4 * st.distinct_keys) {
                    more_keys = key_heads(req->handler_id, std::max(64, 2 * max), req->per_key, lanes, now,
                                          req->take_notified, &heads);
                    heads_added = true;
                    add_rows(&rows, heads);
                    nchosen = plan(rows, max, req->per_key, now_ms, &st, chosen);
                }
                // Every key's head has been seen: only unkeyed rows or keys past
                // the walk's limit can still be found further on. Unkeyed rows
                // behind the hot runs are looked for (by widening as before) when
                // the window holds some, and on every 16th claim of the handler,
                // so that they wait a few claims at most, never for the runs.
                if (heads_added &&
                    (nchosen >= max || (st.unkeyed_rows == 0 && !more_keys && hint->claims % 16 != 0)))
                    break;
                if (window * 4 >= guc_claim_scan_limit) break;
                // From a hint the window is usually close: double it; from a cold
                // start quadruple it, as before.
                window = std::min(window * (hinted > 0 ? 2 : 4), cap);
            }
            // With hot keys the heads do the finding; the window only has to
            // cover unkeyed and old rows: start the next one at max.
            if (heads_added) rows_needed = std::min<int64>(rows_needed, max);
            // Next time start a little past what this claim needed; grow at once,
            // shrink slowly: a concurrent claimer's leases come and go, and a
            // window that shrank below them would cost a second scan.
            int target = static_cast<int>(std::min<int64>(rows_needed + rows_needed / 8 + 8, cap));
            hinted = std::max(target, hinted - hinted / 16);
            if (req->use_floor) break;
            // Nothing more ahead of the frontier: look behind it too. (Short
            // because the rows ahead are held by concurrent claimers: not.)
            if (view.head || nchosen >= max || !exhausted) break;
            view.head = true;
            for (int p = 0; p < 4; p++) view.from[p] = floor[p];
        }
        if (track_floor && view.head) {  // the last scan started at the floor
            FloorView used;
            used.head = std::all_of(floor, floor + 4, [](int64 f) { return f == 0; });
            for (int p = 0; p < 4; p++) used.from[p] = floor[p];
            if (req->use_floor)
                floor_note(req->handler_id, used, first, highest, xmin);
            else
                frontier_note_floor(req->handler_id, view, used, first, highest, xmin);
        }
        hint->claims++;
        charge_expired(rows, now);
        if (nchosen == 0) return;

        bool* got = static_cast<bool*>(palloc(sizeof(bool) * nchosen));
        LeaseToken* tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * nchosen));
        int taken = leases_acquire(chosen, nchosen, req->handler_id, req->kind, now, until, req->take_notified,
                                   XactReadOnly, got, tokens);
        // Before the fetch: a concurrent claimer (or this one's next round)
        // starts past these leases at once.
        if (req->use_frontier && !heads_added) advance_frontier(req->handler_id, view, rows, chosen, nchosen, now);
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
        int nout = finalize(chosen, got, nchosen, order);

        // Leases taken for rows that are not handed over go back at once.
        int64* kept = static_cast<int64*>(palloc(sizeof(int64) * (nout + 1)));
        for (int i = 0; i < nout; i++) kept[i] = spi_int64(order[i], 1);
        qsort(kept, nout, sizeof(int64), cmp_int64);
        int64* give_back = static_cast<int64*>(palloc(sizeof(int64) * nchosen));
        LeaseToken* give_tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * nchosen));
        int ngive = 0;
        for (int i = 0; i < nchosen; i++)
            if (got[i] && bsearch(&chosen[i], kept, nout, sizeof(int64), cmp_int64) == nullptr) {
                give_tokens[ngive] = tokens[i];
                give_back[ngive++] = chosen[i];
            }
        leases_release(give_back, give_tokens, ngive);
        int fetched = static_cast<int>(SPI_processed);
        // Rows given back that are still there (not ready, or behind their
        // key's head) are claimable again below the frontier, and an earlier
        // row of their key may be below it, unseen by scans from it.
        bool noted_key = false;
        if (req->use_frontier && ngive > 0) {
            IdRow* present = static_cast<IdRow*>(palloc(sizeof(IdRow) * (fetched + 1)));
            for (int r = 0; r < fetched; r++) present[r] = IdRow{spi_int64(r, 1), r};
            qsort(present, fetched, sizeof(IdRow), cmp_int64);  // id is the first member
            for (int i = 0; i < ngive; i++) {
                auto* hit = static_cast<IdRow*>(bsearch(&give_back[i], present, fetched, sizeof(IdRow), cmp_int64));
                if (hit == nullptr) continue;
                frontier_lower(req->handler_id, give_back[i]);
                char* key = SPI_getvalue(SPI_tuptable->vals[hit->row], SPI_tuptable->tupdesc, 4);
                if (key != nullptr) {
                    frontier_note_key(req->handler_id, frontier_key_hash(key));
                    noted_key = true;
                }
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

RELAYBUS_SQL_FUNCTION(relay_claim) {
    refuse_during_recovery("relay_claim()");
    if (PG_ARGISNULL(0))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("handler must not be NULL")));
    char* name = text_arg(fcinfo, 0, nullptr);
    if (PG_ARGISNULL(1))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("max must be between 1 and 10000, not NULL")));
    int max = PG_GETARG_INT32(1);
    if (max < 1 || max > 10000)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("max must be between 1 and 10000, not %d", max)));
    int per_key = PG_ARGISNULL(3) ? 1 : PG_GETARG_INT32(3);
    if (per_key < 1 || per_key > 10000)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("per_key must be between 1 and 10000, not %d", per_key)));

    const HandlerEntry* h = catalog_handler_by_name(name);
    if (h == nullptr)
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT), errmsg("handler \"%s\" does not exist", name)));
    // An ack-mode notify handler may be claimed too: a LISTEN consumer drains
    // what is pending when it starts, taking over NOTIFYs nobody acked.
    bool notify_ack = h->kind == core::HandlerKind::Notify && h->options.ack;
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
    req.lease_ms = h->options.lease_ms;
    if (!PG_ARGISNULL(2)) {
        req.lease_ms = interval_to_ms(PG_GETARG_INTERVAL_P(2));
        if (req.lease_ms < 1000 || req.lease_ms > 86400000LL)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("lease must be between 1 second and 1 day")));
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
    constexpr int kColumns = 12;  // id .. published_at, lease_until, lease
    bool with_lease = rsinfo->setDesc->natts >= kColumns;
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
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, nulls);
    }
    spi_end(&scope);
    return (Datum)0;
}
