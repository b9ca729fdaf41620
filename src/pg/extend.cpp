// relay_extend: lengthen a held lease (like pgmq's set_vt or SQS's
// ChangeMessageVisibility). The new end is counted from now; the same checks
// as a completion apply (pg/leases.hpp), and nothing is written to a table.

#include "pg/catalog_cache.hpp"
#include "pg/leases.hpp"
#include "pg/pg_includes.hpp"
#include "pg/recovery_guard.hpp"
#include "pg/spi_support.hpp"

extern "C" {
PG_FUNCTION_INFO_V1(relay_extend);
}

namespace relaybus::pg {

static SavedPlan handler_of_plan = {
    "SELECT handler_id FROM relay.deliveries WHERE id = $1", 1, {INT8OID}, nullptr, PlanShape::IdLookups};

}  // namespace relaybus::pg

using namespace relaybus;
using namespace relaybus::pg;

// relay_extend(id bigint, lease uuid, extend_by interval DEFAULT NULL) RETURNS timestamptz
extern "C" Datum relay_extend(PG_FUNCTION_ARGS) {
  refuse_during_recovery("relay_extend()");
  if (PG_ARGISNULL(0)) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("id must not be NULL")));
  int64 id = PG_GETARG_INT64(0);
  bool with_token = !PG_ARGISNULL(1);
  LeaseToken token;
  if (with_token) token = *PG_GETARG_UUID_P(1);
  int64 extend_ms = -1;  // the handler's lease option
  if (!PG_ARGISNULL(2)) {
    extend_ms = interval_to_ms(PG_GETARG_INTERVAL_P(2));
    if (extend_ms < 1000 || extend_ms > 86400000LL)
      ereport(ERROR,
              (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("extend_by must be between 1 second and 1 day")));
  }

  SpiScope scope;
  spi_begin(&scope);
  Datum idd = Int64GetDatum(id);
  spi_exec_latest(&handler_of_plan, &idd, nullptr, true, 1);
  if (SPI_processed == 0)
    ereport(ERROR, (errcode(ERRCODE_NO_DATA_FOUND), errmsg("delivery %lld does not exist", static_cast<long long>(id)),
                    errdetail("It was acked or dead-lettered already, or never existed.")));
  bool isnull = false;
  int32 handler_id = DatumGetInt32(spi_col(0, 1, &isnull));
  spi_end(&scope);
  if (extend_ms < 0) {
    const HandlerEntry* h = catalog_handler_by_id(handler_id);
    extend_ms = h != nullptr ? h->lease_ms : 30000;
  }
  TimestampTz now = GetCurrentTimestamp();
  TimestampTz until = TimestampTzPlusMilliseconds(now, extend_ms);
  LeaseCheck check = leases_extend(id, with_token ? &token : nullptr, now, until);
  if (check != LeaseCheck::Held) report_lease_not_held(id, check, with_token);
  PG_RETURN_TIMESTAMPTZ(until);
}
