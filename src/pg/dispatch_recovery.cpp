#include "pg/dispatch_recovery.hpp"

#include "core/error_class.hpp"
#include "pg/boundary.hpp"
#include "pg/http_delivery.hpp"
#include "pg/pg_compat.hpp"
#include "pg/settle.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_xact.hpp"

namespace relaybus::pg {

namespace {

// Only if this dispatcher still holds its lease.
void nack_poison(MemoryContext cxt, int64 id, const LeaseToken& token, const char* message) {
  ErrorData* error = worker_step(cxt, [&] {
    worker_xact_begin();
    SpiScope scope;
    spi_begin(&scope);
    LeaseCheck check;
    const char* outcome = "lost its lease, not nacked";
    if (leases_begin_completion(&id, &token, nullptr, 1, GetCurrentTimestamp(), &check) == 1) {
      Settlement failed = settlement_failed(id, -1, message);
      judge_failures(&failed, 1);
      outcome = settle(&failed, 1) == 0 ? "gone" : failed.outcome == SettleOutcome::Dead ? "dead" : "retry";
    }
    spi_end(&scope);
    worker_xact_commit();
    ereport(LOG, (errmsg("relaybus dispatcher: delivery %lld failed alone (%s); %s", static_cast<long long>(id),
                         message, outcome[0] == 'd' ? "dead-lettered" : (outcome[0] == 'r' ? "will retry" : outcome))));
  });
  if (error == nullptr) return;
  ereport(LOG, (errcode(error->sqlerrcode), errmsg("relaybus dispatcher: could not nack delivery %lld: %s",
                                                   static_cast<long long>(id), error->message)));
  FreeErrorData(error);
}

}  // namespace

void after_error(DispatcherState* st, MemoryContext cxt, ErrorData* ed) {
  http_drop_staged();
  otlp_notify_dropped();
  st->known_extension = InvalidOid;  // dropped meanwhile, by a way that did not count? look again
  const char* message = ed->message != nullptr ? ed->message : "(no message)";
  core::ErrorCause cause = core::classify_error(unpack_sql_state(ed->sqlerrcode), message);
  ereport(LOG, (errmsg("relaybus dispatcher: iteration failed (cause: %s, SQLSTATE %s, %d in flight): %s",
                       core::error_cause_name(cause), unpack_sql_state(ed->sqlerrcode), st->ninflight, message)));
  LWLockAcquire(workers->lock, LW_EXCLUSIVE);
  workers->slots[st->slot].failed++;
  strlcpy(workers->slots[st->slot].last_error, message, sizeof(workers->slots[st->slot].last_error));
  LWLockRelease(workers->lock);
  int64 now_ms = timestamptz_to_epoch_ms(GetCurrentTimestamp());
  if (st->policy.after_error(cause, st->ninflight, now_ms) == core::AfterError::NackPoison) {
    nack_poison(cxt, st->inflight[0], st->inflight_tokens[0], message);
    st->ninflight = 0;
  } else {
    release_inflight(st);  // Backoff, Isolate: nobody's attempt is charged yet
  }
  FreeErrorData(ed);
}

}  // namespace relaybus::pg
