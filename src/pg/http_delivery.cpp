#include "pg/http_delivery.hpp"

#include "pg/boundary.hpp"
#include "pg/cpp/pipeline_host.h"
#include "pg/leases.hpp"
#include "pg/pg_compat.hpp"
#include "pg/settings.hpp"
#include "pg/settle.hpp"
#include "pg/spi_support.hpp"
#include "pg/wait_set.hpp"
#include "pg/worker_state.hpp"
#include "pg/worker_xact.hpp"

namespace relaybus::pg {

namespace {

static_assert(sizeof(LeaseToken) == sizeof(uint64[2]), "a receipt carries a lease token");

int64 now_ms() { return timestamptz_to_epoch_ms(GetCurrentTimestamp()); }

const char* allowlist_setting() { return guc_http_allowlist != nullptr ? guc_http_allowlist : ""; }

// Plain glue (no C++ object lives here): settles a batch in a transaction of
// its own, as the pipeline decided each one. Each is a compare-and-mark on its
// lease token: a dispatcher that lost the lease meanwhile (stalled past it
// while another took over) settles nothing.
void complete_in_xact(const PipelineResult* c, int n) {
  TimestampTz now = GetCurrentTimestamp();
  int64 nowms = timestamptz_to_epoch_ms(now);
  int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
  LeaseToken* tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * n));
  LeaseCheck* checks = static_cast<LeaseCheck*>(palloc(sizeof(LeaseCheck) * n));
  Settlement* held = static_cast<Settlement*>(palloc(sizeof(Settlement) * n));
  for (int i = 0; i < n; i++) {
    ids[i] = c[i].id;
    memcpy(&tokens[i], &c[i].receipt, sizeof(LeaseToken));
  }
  int nheld = 0;
  bool kafka_key_freed = false;
  worker_xact_begin();
  SpiScope scope;
  spi_begin(&scope);
  (void)leases_begin_completion(ids, tokens, nullptr, n, now, checks);
  for (int i = 0; i < n; i++) {
    const HandlerEntry* h = catalog_handler_by_id(c[i].handler_key);
    bool kafka = h != nullptr && h->kind == core::HandlerKind::Kafka;
    int64 open_until = c[i].breaker_open_until_ms;
    count_attempt(MyDatabaseId, c[i].handler_key, kafka ? -1 : c[i].status,
                  open_until != 0 ? TimestampTzPlusMilliseconds(now, open_until - nowms) : 0, c[i].send_ms,
                  c[i].after_gap);
    if (checks[i] != LeaseCheck::Held) continue;  // the lease expired or another holder has it
    SettleOutcome outcome = c[i].outcome == ResultOutcome::Delivered ? SettleOutcome::Delivered
                            : c[i].outcome == ResultOutcome::Dead    ? SettleOutcome::Dead
                                                                     : SettleOutcome::Retry;
    if (kafka && outcome != SettleOutcome::Retry) kafka_key_freed = true;
    held[nheld++] = settlement_judged(c[i].id, outcome, c[i].retry_in_ms,
                                      outcome == SettleOutcome::Delivered ? nullptr : pstrdup(c[i].error), c[i].status);
  }
  (void)settle(held, nheld);
  spi_end(&scope);
  // A kafka delivery that ended frees its key: the key's next message goes
  // to the same partition right after. Were this commit forgotten by a
  // crash (relaybus.worker_synchronous_commit = off), the ended one would be
  // produced again after its successor and the partition would rewind the
  // key; so this commit waits for the local WAL flush.
  if (kafka_key_freed)
    (void)set_config_option("synchronous_commit", "local", PGC_SUSET, PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
  worker_xact_commit();
  if (nheld < n)
    ereport(LOG, (errmsg("relaybus dispatcher: %d http result(s) not completed: their leases were lost", n - nheld),
                  errdetail("The request outlived its lease (this worker stalled, or the lease ran out); "
                            "the delivery's next holder completes it.")));
}

// Plain glue: gives back the leases of deliveries that were never sent, on
// their tokens (a lease another holder has now stays theirs).
void release_leases(const ReleasedLease* d, int n) {
  int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
  LeaseToken* tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * n));
  for (int i = 0; i < n; i++) {
    ids[i] = d[i].id;
    memcpy(&tokens[i], d[i].receipt, sizeof(LeaseToken));
  }
  leases_release(ids, tokens, n);
  pfree(ids);
  pfree(tokens);
}

// Creates the engine and the pipeline, or gives the engine a reloaded
// relaybus.http_allowlist: at once, with requests in flight too (the engine
// checks every connection and every request against the list in force).
// Returns false (with a log line) if the setting is bad.
bool ensure_engine() {
  ErrorRecord err;
  if (!host_ensure(allowlist_setting(), guc_max_in_flight, &err)) {
    ereport(WARNING, (errmsg("relaybus: http callouts are off: %s", err.message)));
    return false;
  }
  return host_running();
}

// The database and the share (worker_index) of this dispatcher in the shared limits: http_limits_start.
Oid limit_db = InvalidOid;
int limit_share = -1;

}  // namespace

bool shared_limit_acquire(int32_t handler_id, int max_concurrency, double rate, int burst, int64_t now,
                          int64_t* retry_in_ms) noexcept {
  return limit_acquire(limit_db, limit_share, handler_id, max_concurrency, rate, burst, now, retry_in_ms);
}

void shared_limit_release(int32_t handler_id) noexcept { limit_release(limit_db, limit_share, handler_id); }

void shared_limit_held_back(int32_t handler_id, int waited, int64_t now) noexcept {
  limit_held_back(limit_db, handler_id, waited, now);
}

void http_limits_start(Oid dboid, int share) {
  limit_db = dboid;
  limit_share = share;
  limit_reset_share(dboid, share);
}

void http_limits_exit() { limit_reset_share(limit_db, limit_share); }

bool store_complete(const PipelineResult* results, int n, ErrorRecord* err) noexcept {
  return pg_catch(err, [&] { complete_in_xact(results, n); });
}

bool store_release(const ReleasedLease* leases, int n, ErrorRecord* err) noexcept {
  return pg_catch(err, [&] { release_leases(leases, n); });
}

int64 http_lease_ms(const HandlerEntry* h) { return Max(h->lease_ms, h->timeout_ms + guc_http_lease_margin_ms); }

int http_capacity(const HandlerEntry* h) {
  if (!ensure_engine()) return 0;
  return host_room(h->id, h->kind, h->config, now_ms());
}

void http_stage(const HandlerEntry* h, const ClaimResult* res) {
  if (res->n == 0) return;
  // The texts the requests need, in plain memory first.
  int n = res->n;
  auto* rows = static_cast<StageRow*>(palloc(sizeof(StageRow) * n));
  for (int i = 0; i < n; i++) {
    const ClaimedRow& c = res->rows[i];
    StageRow& r = rows[i];
    r.id = c.id;
    r.event_id = c.event_id;
    r.topic = c.topic;
    r.key = c.key;
    r.seq = c.seq;
    r.attempt = c.attempt;
    r.published_at_ms = timestamptz_to_epoch_ms(c.published_at);
    r.published = c.published_at;
    r.payload_json = c.payload != nullptr ? JsonbToCString(nullptr, &c.payload->root, VARSIZE(c.payload)) : nullptr;
    r.headers_json = c.headers != nullptr ? JsonbToCString(nullptr, &c.headers->root, VARSIZE(c.headers)) : nullptr;
    memcpy(r.receipt, &c.token, sizeof(LeaseToken));
  }
  int64 now = now_ms();
  // A queued request must still be sent, and answered within its timeout,
  // while its lease holds (http_lease_ms), with half the lease margin to
  // spare for the completing transaction: else it is not sent and its lease
  // goes back.
  int64 expires = now + Max(1000, http_lease_ms(h) - h->timeout_ms - guc_http_lease_margin_ms / 2);
  ErrorRecord err;
  if (!host_stage(h->id, h->kind, h->name, h->config, rows, n, expires, &err))
    raise_error_in("relaybus could not prepare http requests", &err);
}

void http_send_staged() {
  if (host_enqueue_staged()) http_pump();
}

void http_pump() {
  if (host_queued() == 0) return;
  // A reloaded allow-list applies to these requests already.
  if (!host_allowlist_is(allowlist_setting())) (void)ensure_engine();
  ErrorRecord err;
  if (!host_pump(now_ms(), &err)) raise_error(&err);
}

void http_release_queued() {
  ErrorRecord err;
  if (!host_release_queued(&err)) raise_error(&err);
}

// Their leases went with the aborted transaction.
void http_drop_staged() { host_drop_staged(); }

size_t http_in_flight() { return host_in_flight(); }

size_t http_outstanding(const HandlerEntry* h) { return host_outstanding(h->id); }

void http_retain_kafka(const int32* ids, int n) { host_retain_kafka(ids, n); }

int http_collect() { return static_cast<int>(host_collect(now_ms())); }

bool http_completion_due() { return host_completion_due(now_ms()); }

int http_complete() {
  if (http_collect() == 0) return 0;
  int64 now = now_ms();
  if (host_flush_paused(now)) return 0;
  size_t n = 0;
  ErrorRecord err;
  if (!host_flush(now, &n, &err)) raise_error(&err);
  return static_cast<int>(n);
}

// Without it every reload or restart would send up to `concurrency`
// deliveries again that the receiver already has. Bounded, so a slow endpoint
// never holds a shutdown up.
void drain_http_on_exit(MemoryContext cxt) {
  constexpr int64 kDrainMs = 3000;
  int64 deadline = now_ms() + kDrainMs;
  ErrorData* error = worker_step(cxt, [&] {
    for (;;) {
      int64 left = deadline - now_ms();
      if (http_in_flight() == 0 || left <= 0) break;
      (void)wait_for_work(static_cast<long>(Min(left, static_cast<int64>(50))));
      MemoryContextReset(cxt);
    }
    http_complete();
  });
  if (error == nullptr) return;
  ereport(LOG, (errcode(error->sqlerrcode),
                errmsg("relaybus dispatcher: could not complete the requests in flight at exit: %s", error->message)));
  FreeErrorData(error);
}

void http_shutdown() {
  http_release_queued();
  OtlpCounters c;
  if (host_otlp_counters(&c))
    ereport(LOG, (errmsg("relaybus dispatcher: spans exported %llu, dropped %llu, failed exports %llu",
                         static_cast<unsigned long long>(c.exported), static_cast<unsigned long long>(c.dropped),
                         static_cast<unsigned long long>(c.failed))));
  host_shutdown();
}

void otlp_pump() {
  if (!host_otlp_configure(guc_otlp_endpoint, guc_otlp_headers)) return;
  const int64 now = now_ms();
  host_otlp_pump(now);
  char why[256];
  OtlpCounters c;
  if (host_otlp_take_error(now, why, sizeof why) && host_otlp_counters(&c))
    ereport(LOG, (errmsg("relaybus dispatcher: span export to %s failed: %s", guc_otlp_endpoint, why),
                  errdetail("Spans exported %llu, dropped %llu, failed exports %llu; dropped spans are not sent again.",
                            static_cast<unsigned long long>(c.exported), static_cast<unsigned long long>(c.dropped),
                            static_cast<unsigned long long>(c.failed))));
}

long otlp_wait_ms() {
  if (!host_otlp_on()) return -1;  // no clock read while export is off
  return static_cast<long>(host_otlp_wake_in_ms(now_ms()));
}

void otlp_notify_sent() {
  if (host_otlp_on()) host_otlp_notify_sent(now_ms());
}

void otlp_notify_dropped() { host_otlp_notify_dropped(); }

}  // namespace relaybus::pg
