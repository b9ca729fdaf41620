// relay_ack and relay_nack: the end of a delivery attempt.
//
// Success deletes the row (the only write of the happy path besides the
// publish INSERT). Failure updates it with the attempt count, the error and
// the backoff, or moves it to relay.dead_letters after max_attempts.
//
// Only the holder of a delivery's lease completes it: each completion names
// the lease (the token relay_claim or the NOTIFY gave out) and is a
// compare-and-mark on (delivery, token) in shared memory (pg/leases.hpp); a
// stale, forged or foreign one changes nothing and fails with 55P03. The id-only
// forms are accepted for leases this session took. The lease goes when the
// completing transaction commits.

#include "pg/catalog_cache.hpp"
#include "pg/claim_frontier.hpp"
#include "pg/leases.hpp"
#include "pg/pg_includes.hpp"
#include "pg/recovery_guard.hpp"
#include "pg/spi_support.hpp"
#include "pg/settle.hpp"
#include "pg/worker_state.hpp"

extern "C" {
PG_FUNCTION_INFO_V1(relay_ack);
PG_FUNCTION_INFO_V1(relay_ack_v1);
PG_FUNCTION_INFO_V1(relay_ack_v2);
PG_FUNCTION_INFO_V1(relay_nack);
PG_FUNCTION_INFO_V1(relay_nack_v1);
PG_FUNCTION_INFO_V1(relay_nack_v2);
}

namespace relaybus::pg {

static SavedPlan exists_plan = {
    "SELECT id FROM relay.deliveries WHERE id = ANY ($1)", 1, {INT8ARRAYOID}, nullptr, PlanShape::IdLookups};

static int cmp_int64(const void* a, const void* b) {
  int64 x = *static_cast<const int64*>(a), y = *static_cast<const int64*>(b);
  return x < y ? -1 : (x > y ? 1 : 0);
}

static bool delivery_exists(int64 id) {
  Datum idd = Int64GetDatum(id);
  Datum arg = PointerGetDatum(construct_array(&idd, 1, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
  spi_exec_latest(&exists_plan, &arg, nullptr, true, 1);
  return SPI_processed > 0;
}

static void report_missing(int64 id) {
  ereport(ERROR, (errcode(ERRCODE_NO_DATA_FOUND), errmsg("delivery %lld does not exist", static_cast<long long>(id)),
                  errdetail("It was acked or dead-lettered already, or never existed; nothing was acked."),
                  errhint("If your lease ran out, another consumer may have handled it.")));
}

// A refused nack: P0002 if the delivery is gone, else 55P03.
static void report_refused_nack(int64 id, LeaseCheck why, bool with_token) {
  if (!delivery_exists(id))
    ereport(ERROR,
            (errcode(ERRCODE_NO_DATA_FOUND), errmsg("delivery %lld does not exist", static_cast<long long>(id))));
  report_lease_not_held(id, why, with_token);
}

struct AckItem {
  int64 id;  // first: sorted with cmp_int64
  LeaseToken token;
  bool has_token;
};

}  // namespace relaybus::pg

using namespace relaybus;
using namespace relaybus::pg;

// relay_ack's body; its entry points (below) pass leases, or NULL for the
// id-only form (0.1.0's signature has no leases).
static Datum ack_deliveries(FunctionCallInfo fcinfo, ArrayType* leases) {
  refuse_during_recovery("relay_ack()");
  if (PG_ARGISNULL(0)) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("ids must not be NULL")));
  ArrayType* arr = PG_GETARG_ARRAYTYPE_P(0);
  Datum* elems;
  bool* nulls;
  int n;
  deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elems, &nulls, &n);
  // leases[i] is the lease of ids[i].
  Datum* lease_elems = nullptr;
  bool* lease_nulls = nullptr;
  if (leases != nullptr) {
    int nl;
    deconstruct_array(leases, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR, &lease_elems, &lease_nulls, &nl);
    if (nl != n)
      ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                      errmsg("leases must have as many elements as ids (%d), not %d", n, nl)));
  }
  if (n == 0) PG_RETURN_INT32(0);
  AckItem* items = static_cast<AckItem*>(palloc0(sizeof(AckItem) * n));
  for (int i = 0; i < n; i++) {
    if (nulls[i]) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("ids[%d] must not be NULL", i + 1)));
    items[i].id = DatumGetInt64(elems[i]);
    items[i].has_token = lease_elems != nullptr && !lease_nulls[i];
    if (items[i].has_token) items[i].token = *DatumGetUUIDP(lease_elems[i]);
  }
  qsort(items, n, sizeof(AckItem), cmp_int64);

  SpiScope scope;
  spi_begin(&scope);
  // All or nothing: every entry must hold its lease, or the call fails (and
  // the transaction's abort clears the marks made here).
  int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
  LeaseToken* tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * n));
  bool* has_token = static_cast<bool*>(palloc(sizeof(bool) * n));
  for (int i = 0; i < n; i++) {
    ids[i] = items[i].id;
    tokens[i] = items[i].token;
    has_token[i] = items[i].has_token;
  }
  LeaseCheck* checks = static_cast<LeaseCheck*>(palloc(sizeof(LeaseCheck) * n));
  if (leases_begin_completion(ids, tokens, has_token, n, GetCurrentTimestamp(), checks) != n) {
    // A delivery that is gone is reported as such (P0002), before any lease.
    Datum* all = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    for (int i = 0; i < n; i++) all[i] = Int64GetDatum(ids[i]);
    Datum arg = PointerGetDatum(construct_array(all, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
    spi_exec_latest(&exists_plan, &arg, nullptr, true, 0);
    int found = static_cast<int>(SPI_processed);
    int64* present = static_cast<int64*>(palloc(sizeof(int64) * (found + 1)));
    for (int i = 0; i < found; i++) present[i] = spi_int64(i, 1);
    qsort(present, found, sizeof(int64), cmp_int64);
    for (int i = 0; i < n; i++)
      if (bsearch(&ids[i], present, found, sizeof(int64), cmp_int64) == nullptr) report_missing(ids[i]);
    for (int i = 0; i < n; i++)
      if (checks[i] != LeaseCheck::Held) report_lease_not_held(ids[i], checks[i], has_token[i]);
  }
  int unique = 0;
  for (int i = 0; i < n; i++)
    if (unique == 0 || ids[unique - 1] != ids[i]) ids[unique++] = ids[i];

  Settlement* done = static_cast<Settlement*>(palloc0(sizeof(Settlement) * unique));
  for (int i = 0; i < unique; i++) done[i] = settlement_delivered(ids[i]);
  int deleted = settle(done, unique);
  bool wake = false;
  for (int i = 0; i < unique; i++) {
    if (!done[i].settled) report_missing(done[i].id);
    if (!wake) {
      const HandlerEntry* h = catalog_handler_by_id(done[i].handler_id);
      wake = h != nullptr && h->kind == core::HandlerKind::Notify;
    }
  }
  // An acked notify delivery (ack mode, or sent by reference) releases its
  // key: wake the dispatchers at commit so the key's next delivery goes out
  // at once, not at the next poll.
  if (wake) wake_dispatchers_at_commit();
  spi_end(&scope);
  PG_RETURN_INT32(deleted);
}

// relay_nack's body; its entry points (below) pass the lease, or NULL for the
// id-only form (0.1.0's signature has no lease).
static Datum nack_one(FunctionCallInfo fcinfo, const LeaseToken* lease) {
  refuse_during_recovery("relay_nack()");
  if (PG_ARGISNULL(0)) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("id must not be NULL")));
  int64 id = PG_GETARG_INT64(0);
  const char* error_text = PG_ARGISNULL(1) ? nullptr : text_to_cstring(PG_GETARG_TEXT_PP(1));
  int64 retry_in_ms = -1;
  if (!PG_ARGISNULL(2)) {
    retry_in_ms = interval_to_ms(PG_GETARG_INTERVAL_P(2));
    if (retry_in_ms < 0)
      ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("retry_in must not be negative")));
    if (retry_in_ms > 366LL * 86400000LL)
      ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("retry_in must be at most 366 days")));
  }

  bool with_token = lease != nullptr;
  LeaseToken token;
  if (with_token) token = *lease;

  SpiScope scope;
  spi_begin(&scope);
  LeaseCheck check;
  if (leases_begin_completion(&id, &token, &with_token, 1, GetCurrentTimestamp(), &check) != 1)
    report_refused_nack(id, check, with_token);
  Settlement failed = settlement_failed(id, retry_in_ms, error_text);
  judge_failures(&failed, 1);
  if (settle(&failed, 1) == 0)
    ereport(ERROR,
            (errcode(ERRCODE_NO_DATA_FOUND), errmsg("delivery %lld does not exist", static_cast<long long>(id))));
  const char* outcome = failed.outcome == SettleOutcome::Dead ? "dead" : "retry";
  spi_end(&scope);
  PG_RETURN_TEXT_P(cstring_to_text(outcome));
}

// The entry points, one per SQL signature. The current install script names
// the _v2 ones.
//   relay_ack(ids bigint[], leases uuid[]): 0.2.0;  relay_ack(ids bigint[]): 0.1.0
//   relay_nack(id, error, retry_in, lease uuid): 0.2.0;  relay_nack(id, error, retry_in): 0.1.0
extern "C" Datum relay_ack_v2(PG_FUNCTION_ARGS) {
  return ack_deliveries(fcinfo, PG_ARGISNULL(1) ? nullptr : PG_GETARG_ARRAYTYPE_P(1));
}
extern "C" Datum relay_ack_v1(PG_FUNCTION_ARGS) { return ack_deliveries(fcinfo, nullptr); }
extern "C" Datum relay_nack_v2(PG_FUNCTION_ARGS) {
  return nack_one(fcinfo, PG_ARGISNULL(3) ? nullptr : PG_GETARG_UUID_P(3));
}
extern "C" Datum relay_nack_v1(PG_FUNCTION_ARGS) { return nack_one(fcinfo, nullptr); }

// The symbols sql/relaybus--0.1.0.sql names (that script is frozen: it is what
// 0.1.0 installs have), which 0.2.0 installs made before the _v2 entry points
// also name for their signatures with a lease: the number of arguments tells
// which catalog calls (docs/operations.md, "Changing the SQL").
extern "C" Datum relay_ack(PG_FUNCTION_ARGS) { return PG_NARGS() == 1 ? relay_ack_v1(fcinfo) : relay_ack_v2(fcinfo); }
extern "C" Datum relay_nack(PG_FUNCTION_ARGS) {
  return PG_NARGS() == 3 ? relay_nack_v1(fcinfo) : relay_nack_v2(fcinfo);
}
