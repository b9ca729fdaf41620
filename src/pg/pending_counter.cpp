#include "pg/pending_counter.hpp"

#include "pg/claim_frontier.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "commands/extension.h"
#include "storage/lmgr.h"
#include "utils/lsyscache.h"
PG_FUNCTION_INFO_V1(relay_recount_pending);
PG_FUNCTION_INFO_V1(relay_count_pending);
}

namespace relaybus::pg {

namespace {

// One pass over the table, whatever its statistics say (plan_settings.hpp).
SavedPlan count_plan = {
    "SELECT handler_id, count(*) FROM relay.deliveries GROUP BY handler_id", 0, {}, nullptr, PlanShape::FullScan};

// Counts with ShareLock on relay.deliveries held (taken by the caller): every
// transaction that wrote it has committed, and its counts were applied at its
// commit (before its locks were released); none writes until this one ends.
void count_locked(Oid extension) {
  SpiScope scope;
  spi_begin(&scope);
  spi_exec_latest(&count_plan, nullptr, nullptr, true, 0);
  int n = static_cast<int>(SPI_processed);
  auto* ids = static_cast<int32*>(palloc(sizeof(int32) * (n + 1)));
  auto* counts = static_cast<int64*>(palloc(sizeof(int64) * (n + 1)));
  for (int i = 0; i < n; i++) {
    bool isnull = false;
    ids[i] = DatumGetInt32(spi_col(i, 1, &isnull));
    counts[i] = DatumGetInt64(spi_col(i, 2, &isnull));
  }
  spi_end(&scope);
  set_pending_counts(MyDatabaseId, extension, ids, counts, n);
}

Oid deliveries_oid() {
  Oid ns = get_namespace_oid("relay", false);
  Oid rel = get_relname_relid("deliveries", ns);
  if (!OidIsValid(rel))
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE), errmsg("relation \"relay.deliveries\" does not exist")));
  return rel;
}

}  // namespace

void ensure_pending_counted(Oid extension) {
  if (pending_counted_for(MyDatabaseId, extension)) return;
  Oid rel = deliveries_oid();
  if (!ConditionalLockRelationOid(rel, ShareLock)) return;  // a writer is busy: next iteration
  count_locked(extension);
  // The lock is held until the dispatcher's transaction ends.
}

}  // namespace relaybus::pg

using namespace relaybus::pg;

// relay._recount_pending(): counts the database's pending deliveries again
// (after rows were written by other means, e.g. pg_restore). Waits for the
// writers in progress and holds publishers back while it counts.
extern "C" Datum relay_recount_pending(PG_FUNCTION_ARGS) {
  Oid extension = get_extension_oid("relaybus", false);
  LockRelationOid(deliveries_oid(), ShareLock);
  count_locked(extension);
  frontier_forget(0);
  rescan_dispatchers_at_commit();
  PG_RETURN_VOID();
}

// relay._count_pending(handler_id, delta): for SQL functions that insert into
// or delete from relay.deliveries (relay_replay): applied at commit.
extern "C" Datum relay_count_pending(PG_FUNCTION_ARGS) {
  if (PG_ARGISNULL(0) || PG_ARGISNULL(1)) PG_RETURN_VOID();
  count_pending_at_commit(PG_GETARG_INT32(0), PG_GETARG_INT64(1));
  // Rows came back with their old ids (relay_replay): claims look from the head.
  if (PG_GETARG_INT64(1) > 0) {
    frontier_forget(PG_GETARG_INT32(0));
    rescan_dispatchers_at_commit();
  }
  PG_RETURN_VOID();
}
