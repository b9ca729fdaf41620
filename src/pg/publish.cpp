// relay_publish and relay_publish_batch: write an event's deliveries in the
// caller's transaction.
//
// A keyed publish is one statement: it bumps the key's counter (locking it until
// commit, so seq order is commit order), draws the event id after that lock, and
// inserts one delivery per routed handler. Concurrent publishers of one key also
// take a transaction advisory lock on the key's hash first, so that the counter
// update never meets a concurrent update under REPEATABLE READ or SERIALIZABLE;
// the statement reads with a fresh snapshot for the same reason.

#include <string>
#include <string_view>
#include <unordered_map>

#include "core/lane_hash.hpp"
#include "core/topic.hpp"
#include "pg/catalog_cache.hpp"
#include "pg/guard.hpp"
#include "pg/pg_includes.hpp"
#include "pg/publish_args.hpp"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"

extern "C" {
#include "storage/lock.h"
PG_FUNCTION_INFO_V1(relay_publish);
PG_FUNCTION_INFO_V1(relay_publish_batch);
}

namespace relaybus::pg {

static_assert(core::kLanes == 64, "the unkeyed lane expression in SQL below assumes 64 lanes");

#define RELAY_DELIVERY_COLUMNS                                                            \
    "id, event_id, seq, published_at, not_before, handler_id, attempt, lane, priority, " \
    "topic, wire_topic, key, payload, headers"

static SavedPlan keyed_plan = {
    "WITH s AS ("
    "  INSERT INTO relay.key_seqs AS k (key, seq) VALUES ($1, 1)"
    "  ON CONFLICT (key) DO UPDATE SET seq = k.seq + 1 RETURNING k.seq"
    "), e AS MATERIALIZED ("
    "  SELECT s.seq, pg_catalog.nextval('relay.event_id_seq'::pg_catalog.regclass) AS eid FROM s"
    ") INSERT INTO relay.deliveries (" RELAY_DELIVERY_COLUMNS ")"
    " SELECT pg_catalog.nextval('relay.delivery_id_seq'::pg_catalog.regclass), e.eid, e.seq,"
    "        pg_catalog.now(), coalesce($4, pg_catalog.now()), h.hid, 0, $2, $3, $5, h.wire, $1, $6, $7"
    "   FROM e, unnest($8::int4[], $9::text[]) AS h(hid, wire)"
    " RETURNING event_id",
    9,
    {TEXTOID, INT2OID, INT2OID, TIMESTAMPTZOID, TEXTOID, JSONBOID, JSONBOID, INT4ARRAYOID,
     TEXTARRAYOID},
    nullptr};

static SavedPlan unkeyed_plan = {
    "WITH e AS MATERIALIZED ("
    "  SELECT pg_catalog.nextval('relay.event_id_seq'::pg_catalog.regclass) AS eid"
    ") INSERT INTO relay.deliveries (" RELAY_DELIVERY_COLUMNS ")"
    " SELECT pg_catalog.nextval('relay.delivery_id_seq'::pg_catalog.regclass), e.eid, NULL,"
    "        pg_catalog.now(), coalesce($2, pg_catalog.now()), h.hid, 0, (e.eid % 64)::int2, $1,"
    "        $3, h.wire, NULL, $4, $5"
    "   FROM e, unnest($6::int4[], $7::text[]) AS h(hid, wire)"
    " RETURNING event_id",
    7,
    {INT2OID, TIMESTAMPTZOID, TEXTOID, JSONBOID, JSONBOID, INT4ARRAYOID, TEXTARRAYOID},
    nullptr};

static SavedPlan unrouted_plan = {
    "SELECT pg_catalog.nextval('relay.event_id_seq'::pg_catalog.regclass)"
    "  FROM pg_catalog.generate_series(1, $1)",
    1,
    {INT4OID},
    nullptr};

static SavedPlan batch_seq_plan = {
    "INSERT INTO relay.key_seqs AS k (key, seq)"
    " SELECT u.key, count(*) FROM pg_catalog.unnest($1::text[]) AS u(key)"
    "  WHERE u.key IS NOT NULL GROUP BY u.key ORDER BY u.key"
    " ON CONFLICT (key) DO UPDATE SET seq = k.seq + excluded.seq"
    " RETURNING k.key, k.seq",
    1,
    {TEXTARRAYOID},
    nullptr};

static SavedPlan batch_insert_plan = {
    "WITH ev AS MATERIALIZED ("
    "  SELECT u.i, pg_catalog.nextval('relay.event_id_seq'::pg_catalog.regclass) AS eid,"
    "         u.p, u.k, u.s, u.l"
    "    FROM unnest($1::jsonb[], $2::text[], $3::int8[], $4::int2[])"
    "         WITH ORDINALITY AS u(p, k, s, l, i)"
    ") INSERT INTO relay.deliveries (" RELAY_DELIVERY_COLUMNS ")"
    " SELECT pg_catalog.nextval('relay.delivery_id_seq'::pg_catalog.regclass), ev.eid, ev.s,"
    "        pg_catalog.now(), coalesce($7, pg_catalog.now()), h.hid, 0,"
    "        coalesce(ev.l, (ev.eid % 64)::int2), $6, $5, h.wire, ev.k, ev.p, $8"
    "   FROM ev, unnest($9::int4[], $10::text[]) AS h(hid, wire)"
    " RETURNING event_id",
    10,
    {JSONBARRAYOID, TEXTARRAYOID, INT8ARRAYOID, INT2ARRAYOID, TEXTOID, INT2OID, TIMESTAMPTZOID,
     JSONBOID, INT4ARRAYOID, TEXTARRAYOID},
    nullptr};

static int cmp_uint64(const void* a, const void* b) {
    uint64 x = *static_cast<const uint64*>(a), y = *static_cast<const uint64*>(b);
    return x < y ? -1 : (x > y ? 1 : 0);
}

static int cmp_int64(const void* a, const void* b) {
    int64 x = *static_cast<const int64*>(a), y = *static_cast<const int64*>(b);
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

// Handler ids and wire names of the routes, as SQL arrays.
static void route_arrays(const RouteTarget* targets, int n, Datum* ids_out, Datum* wires_out) {
    Datum* ids = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    Datum* wires = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    bool* wire_nulls = static_cast<bool*>(palloc(sizeof(bool) * n));
    for (int i = 0; i < n; i++) {
        ids[i] = Int32GetDatum(targets[i].handler_id);
        wire_nulls[i] = targets[i].wire_name == nullptr;
        wires[i] = wire_nulls[i] ? (Datum)0 : CStringGetTextDatum(targets[i].wire_name);
    }
    int dims[1] = {n};
    int lbs[1] = {1};
    *ids_out = PointerGetDatum(construct_array(ids, n, INT4OID, 4, true, TYPALIGN_INT));
    *wires_out = PointerGetDatum(
        construct_md_array(wires, wire_nulls, 1, dims, lbs, TEXTOID, -1, false, TYPALIGN_INT));
}

static int64 unrouted_event_id() {
    SpiScope scope;
    spi_begin(&scope);
    Datum one = Int32GetDatum(1);
    spi_exec(&unrouted_plan, &one, nullptr, false, 0);
    int64 id = spi_int64(0, 1);
    spi_end(&scope);
    return id;
}

}  // namespace relaybus::pg

using namespace relaybus;
using namespace relaybus::pg;

extern "C" Datum relay_publish(PG_FUNCTION_ARGS) {
    PublishCommon common;
    read_publish_common(fcinfo, /*headers*/ 3, /*priority*/ 4, /*not_before*/ 5, &common);

    if (PG_ARGISNULL(1))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("payload must not be NULL")));
    Datum payload = PG_GETARG_DATUM(1);
    check_payload_size(payload, -1);

    int key_len = 0;
    char* key = PG_ARGISNULL(2) ? nullptr : text_arg(fcinfo, 2, &key_len);
    if (key != nullptr) check_key(key, key_len, -1);

    const RouteTarget* targets = nullptr;
    int ntargets = catalog_routes_for(common.topic, &targets);
    if (ntargets == 0) PG_RETURN_INT64(unrouted_event_id());

    Datum handler_ids, wires;
    route_arrays(targets, ntargets, &handler_ids, &wires);
    bool wake = needs_workers(targets, ntargets);

    SpiScope scope;
    spi_begin(&scope);
    int64 event_id;
    if (key != nullptr) {
        lock_key(key, key_len);
        int lane = core::lane_for_key(std::string_view(key, key_len));
        Datum values[9] = {CStringGetTextDatum(key),
                           Int16GetDatum(static_cast<int16>(lane)),
                           Int16GetDatum(static_cast<int16>(common.priority)),
                           TimestampTzGetDatum(common.not_before),
                           CStringGetTextDatum(common.topic),
                           payload,
                           common.headers,
                           handler_ids,
                           wires};
        char nulls[10] = "         ";
        if (common.not_before_null) nulls[3] = 'n';
        if (common.headers_null) nulls[6] = 'n';
        spi_exec_latest(&keyed_plan, values, nulls, false, 0);
        event_id = spi_int64(0, 1);
    } else {
        Datum values[7] = {Int16GetDatum(static_cast<int16>(common.priority)),
                           TimestampTzGetDatum(common.not_before),
                           CStringGetTextDatum(common.topic),
                           payload,
                           common.headers,
                           handler_ids,
                           wires};
        char nulls[8] = "       ";
        if (common.not_before_null) nulls[1] = 'n';
        if (common.headers_null) nulls[4] = 'n';
        spi_exec(&unkeyed_plan, values, nulls, false, 0);
        event_id = spi_int64(0, 1);
    }
    spi_end(&scope);
    if (wake) wake_dispatchers_at_commit();
    PG_RETURN_INT64(event_id);
}

namespace relaybus::pg {

// Per event of a batch, its seq from the counters the upsert returned: the
// statement returns each key's last seq; the batch's occurrences of that key
// take the values just below it, in batch order.
static bool assign_batch_seqs(int n, char** keys, const int* key_lens, const bool* key_nulls,
                              int nresult, char** result_keys, const int64* result_last,
                              int64* seqs, int16* lanes, std::string* why) {
    std::unordered_map<std::string_view, int64> counts;
    counts.reserve(nresult * 2 + 1);
    for (int i = 0; i < n; i++)
        if (!key_nulls[i]) counts[std::string_view(keys[i], key_lens[i])]++;
    std::unordered_map<std::string_view, int64> next;
    next.reserve(nresult * 2 + 1);
    for (int j = 0; j < nresult; j++) {
        std::string_view k(result_keys[j]);
        auto c = counts.find(k);
        if (c == counts.end()) {
            *why = "key counter returned for a key not in the batch";
            return false;
        }
        next[k] = result_last[j] - c->second + 1;
    }
    for (int i = 0; i < n; i++) {
        if (key_nulls[i]) continue;
        std::string_view k(keys[i], key_lens[i]);
        auto it = next.find(k);
        if (it == next.end()) {
            *why = "no key counter returned for a key of the batch";
            return false;
        }
        seqs[i] = it->second++;
        lanes[i] = static_cast<int16>(core::lane_for_key(k));
    }
    return true;
}

}  // namespace relaybus::pg

extern "C" Datum relay_publish_batch(PG_FUNCTION_ARGS) {
    PublishCommon common;
    read_publish_common(fcinfo, 3, 4, 5, &common);

    if (PG_ARGISNULL(1))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("payloads must not be NULL")));
    ArrayType* payload_array = PG_GETARG_ARRAYTYPE_P(1);
    if (ARR_NDIM(payload_array) > 1)
        ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
                        errmsg("payloads must be a one-dimensional array")));
    Datum* payloads;
    bool* payload_nulls;
    int n;
    deconstruct_array(payload_array, JSONBOID, -1, false, TYPALIGN_INT, &payloads, &payload_nulls, &n);
    if (n > kMaxBatch)
        ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                        errmsg("too many events in one batch: %d", n),
                        errdetail("relay_publish_batch takes at most %d events per call.", kMaxBatch)));
    for (int i = 0; i < n; i++) {
        if (payload_nulls[i])
            ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                            errmsg("payloads[%d] must not be NULL", i + 1)));
        check_payload_size(payloads[i], i + 1);
    }

    char** keys = static_cast<char**>(palloc0(sizeof(char*) * (n + 1)));
    int* key_lens = static_cast<int*>(palloc0(sizeof(int) * (n + 1)));
    bool* key_nulls = static_cast<bool*>(palloc(sizeof(bool) * (n + 1)));
    Datum key_array_datum = (Datum)0;
    bool any_key = false;
    for (int i = 0; i < n; i++) key_nulls[i] = true;
    if (!PG_ARGISNULL(2)) {
        ArrayType* key_array = PG_GETARG_ARRAYTYPE_P(2);
        Datum* kd;
        bool* kn;
        int nk;
        if (ARR_NDIM(key_array) > 1)
            ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
                            errmsg("keys must be a one-dimensional array")));
        deconstruct_array(key_array, TEXTOID, -1, false, TYPALIGN_INT, &kd, &kn, &nk);
        if (nk != n)
            ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
                            errmsg("keys must have as many elements as payloads"),
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
        key_array_datum = PointerGetDatum(key_array);
    }

    if (n == 0) PG_RETURN_ARRAYTYPE_P(construct_empty_array(INT8OID));

    const RouteTarget* targets = nullptr;
    int ntargets = catalog_routes_for(common.topic, &targets);
    Datum handler_ids = 0, wires = 0;
    bool wake = false;
    if (ntargets > 0) {
        route_arrays(targets, ntargets, &handler_ids, &wires);
        wake = needs_workers(targets, ntargets);
    }

    int64* seqs = static_cast<int64*>(palloc0(sizeof(int64) * (n + 1)));
    int16* lanes = static_cast<int16*>(palloc0(sizeof(int16) * (n + 1)));
    Datum* event_ids = static_cast<Datum*>(palloc(sizeof(Datum) * (n + 1)));

    SpiScope scope;
    spi_begin(&scope);
    if (ntargets == 0) {
        Datum count = Int32GetDatum(n);
        spi_exec(&unrouted_plan, &count, nullptr, false, 0);
        for (int i = 0; i < n; i++) event_ids[i] = Int64GetDatum(spi_int64(i, 1));
    } else {
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
                SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(hashes[i] >> 32),
                                     static_cast<uint32>(hashes[i]), 3);
                (void)LockAcquire(&tag, ExclusiveLock, false, false);
            }
            spi_exec_latest(&batch_seq_plan, &key_array_datum, nullptr, false, 0);
            int nres = static_cast<int>(SPI_processed);
            char** rkeys = static_cast<char**>(palloc(sizeof(char*) * (nres + 1)));
            int64* rlast = static_cast<int64*>(palloc(sizeof(int64) * (nres + 1)));
            for (int j = 0; j < nres; j++) {
                rkeys[j] = SPI_getvalue(SPI_tuptable->vals[j], SPI_tuptable->tupdesc, 1);
                rlast[j] = spi_int64(j, 2);
            }
            char err[kErrLen];
            if (!run_core([&](std::string* why) {
                    return assign_batch_seqs(n, keys, key_lens, key_nulls, nres, rkeys, rlast, seqs,
                                             lanes, why);
                }, err))
                elog(ERROR, "relaybus: %s", err);
        }
        Datum* seq_datums = static_cast<Datum*>(palloc(sizeof(Datum) * n));
        Datum* lane_datums = static_cast<Datum*>(palloc(sizeof(Datum) * n));
        Datum* key_datums = static_cast<Datum*>(palloc(sizeof(Datum) * n));
        for (int i = 0; i < n; i++) {
            seq_datums[i] = Int64GetDatum(seqs[i]);
            lane_datums[i] = Int16GetDatum(lanes[i]);
            key_datums[i] = key_nulls[i] ? (Datum)0 : CStringGetTextDatum(keys[i]);
        }
        int dims[1] = {n};
        int lbs[1] = {1};
        Datum values[10] = {
            PointerGetDatum(construct_array(payloads, n, JSONBOID, -1, false, TYPALIGN_INT)),
            PointerGetDatum(construct_md_array(key_datums, key_nulls, 1, dims, lbs, TEXTOID, -1,
                                               false, TYPALIGN_INT)),
            PointerGetDatum(construct_md_array(seq_datums, key_nulls, 1, dims, lbs, INT8OID, 8,
                                               FLOAT8PASSBYVAL, TYPALIGN_DOUBLE)),
            PointerGetDatum(construct_md_array(lane_datums, key_nulls, 1, dims, lbs, INT2OID, 2,
                                               true, TYPALIGN_SHORT)),
            CStringGetTextDatum(common.topic),
            Int16GetDatum(static_cast<int16>(common.priority)),
            TimestampTzGetDatum(common.not_before),
            common.headers,
            handler_ids,
            wires};
        char nulls[11] = "          ";
        if (common.not_before_null) nulls[6] = 'n';
        if (common.headers_null) nulls[7] = 'n';
        if (any_key)
            spi_exec_latest(&batch_insert_plan, values, nulls, false, 0);
        else
            spi_exec(&batch_insert_plan, values, nulls, false, 0);
        // RETURNING yields one row per delivery; event ids grow in batch order.
        int64 last = -1;
        int k = 0;
        int64* ret = static_cast<int64*>(palloc(sizeof(int64) * (SPI_processed + 1)));
        for (uint64 r = 0; r < SPI_processed; r++) ret[r] = spi_int64(static_cast<int>(r), 1);
        qsort(ret, SPI_processed, sizeof(int64), cmp_int64);
        for (uint64 r = 0; r < SPI_processed && k < n; r++) {
            if (ret[r] == last) continue;
            last = ret[r];
            event_ids[k++] = Int64GetDatum(last);
        }
        if (k != n) elog(ERROR, "relaybus: batch inserted %d events, expected %d", k, n);
    }
    spi_end(&scope);
    if (wake) wake_dispatchers_at_commit();
    PG_RETURN_ARRAYTYPE_P(construct_array(event_ids, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}
