#include "pg/handler_alerts.hpp"

#include "pg/catalog_cache.hpp"

extern "C" {
#include "access/xact.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "utils/timestamp.h"
}

namespace relaybus::pg {

void alert_event(HandlerCounters* c, AlertKind kind, int status, TimestampTz until, PendingAlert* out) {
  if (c == nullptr) return;
  TimestampTz now = GetCurrentTimestamp();
  if (c->last_alert[kind] != 0 && now < TimestampTzPlusMilliseconds(c->last_alert[kind], kAlertLogIntervalMs)) {
    c->alerts_suppressed[kind]++;
    return;
  }
  c->last_alert[kind] = now;
  out->kind = kind;
  out->suppressed = c->alerts_suppressed[kind];
  out->status = status;
  out->until = until;
  c->alerts_suppressed[kind] = 0;
}

void alert_log(Oid dboid, int32 handler_id, const PendingAlert& a) {
  if (a.kind == kAlertKinds) return;
  // The name from the catalog already loaded (no reload here: this may run
  // between a worker's statements); the database's name inside a transaction.
  const char* handler = catalog_handler_name_loaded(handler_id);
  const char* database = IsTransactionState() ? get_database_name(dboid) : nullptr;
  char who[160];
  if (handler != nullptr)
    snprintf(who, sizeof(who), "handler \"%s\"", handler);
  else
    snprintf(who, sizeof(who), "handler id %d", handler_id);
  char db[100];
  if (database != nullptr)
    snprintf(db, sizeof(db), "database \"%s\"", database);
  else
    snprintf(db, sizeof(db), "database oid %u", dboid);
  char status[48] = "";
  if (a.status == 0)
    snprintf(status, sizeof(status), " (no response)");
  else if (a.status > 0)
    snprintf(status, sizeof(status), " (HTTP %d)", a.status);
  char more[64] = "";
  if (a.suppressed > 0) snprintf(more, sizeof(more), "; %u more since the last such line", a.suppressed);
  switch (a.kind) {
    case kAlertStartedFailing:
      ereport(LOG, (errmsg("relaybus: %s in %s: deliveries started failing%s%s", who, db, status, more)));
      break;
    case kAlertBreakerOpened:
      ereport(LOG, (errmsg("relaybus: %s in %s: circuit breaker opened until %s%s%s", who, db,
                           timestamptz_to_str(a.until), status, more)));
      break;
    case kAlertBreakerClosed:
      ereport(LOG, (errmsg("relaybus: %s in %s: circuit breaker closed%s", who, db, more)));
      break;
    case kAlertDeadLettered:
      ereport(LOG, (errmsg("relaybus: %s in %s: a delivery was dead-lettered%s%s", who, db, status, more),
                    errhint("See relay.dead_letters; relay_replay() sends it again.")));
      break;
    default:
      break;
  }
}

}  // namespace relaybus::pg
