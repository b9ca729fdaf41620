#include "pg/http_delivery.hpp"

#include "pg/boundary.hpp"
#include "pg/cpp/pipeline_host.h"
#include "pg/leases.hpp"
#include "pg/pg_compat.hpp"
#include "pg/settings.hpp"
#include "pg/settle.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"
#include "pg/worker_xact.hpp"

extern "C" {
#include "pgstat.h"
#include "storage/latch.h"
}

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
    count_http(MyDatabaseId, c[i].handler_key, kafka ? -1 : c[i].status,
               open_until != 0 ? TimestampTzPlusMilliseconds(now, open_until - nowms) : 0);
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

}  // namespace

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

namespace {

// The wait set of http_wait, kept across waits while the engine has a
// ready_fd: latch, postmaster death, the kafka producers' fd and the
// engine's. Building a set per wait cost an epoll_create1, an epoll_ctl per
// socket in flight and a close every time.
WaitEventSet* kept_set = nullptr;
int kept_engine_fd = -1, kept_kafka_fd = -1;

void drop_kept_set() {
  if (kept_set != nullptr) FreeWaitEventSet(kept_set);
  kept_set = nullptr;
}

WaitEventSet* kept_wait_set(int engine_fd, int kafka_fd) {
  if (kept_set != nullptr && kept_engine_fd == engine_fd && kept_kafka_fd == kafka_fd) return kept_set;
  drop_kept_set();
  WaitEventSet* set = relaybus_wait_event_set(true, 4);
  AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
  AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
  if (kafka_fd >= 0) AddWaitEventToSet(set, WL_SOCKET_READABLE, kafka_fd, nullptr, nullptr);
  AddWaitEventToSet(set, WL_SOCKET_READABLE, engine_fd, nullptr, nullptr);
  kept_set = set;
  kept_engine_fd = engine_fd;
  kept_kafka_fd = kafka_fd;
  return set;
}

}  // namespace

bool http_wait(long timeout_ms) {
  int64 nowms = now_ms();
  bool running = host_running();
  int cap = running ? host_socket_count() : 0;
  SocketWait none;
  SocketWait* sockets = cap > 0 ? static_cast<SocketWait*>(palloc(sizeof(SocketWait) * cap)) : &none;
  WaitPlan plan;
  int nsock = host_wait_plan(nowms, sockets, cap, &plan);
  // libcurl's own timers (often 0 or 1 ms while transfers run) end the wait
  // too, but they are the engine's business: they do not call for a claim or
  // a completion, so they do not count as a wake-up.
  bool engine_timer = false;
  if (plan.engine_timeout_ms >= 0 && plan.engine_timeout_ms < timeout_ms) {
    timeout_ms = static_cast<long>(plan.engine_timeout_ms);
    engine_timer = true;
  }
  // An open breaker lets its probe through when its backoff ends.
  if (plan.next_probe_ms >= 0 && plan.next_probe_ms - nowms + 1 < timeout_ms) {
    timeout_ms = static_cast<long>(plan.next_probe_ms - nowms + 1);
    engine_timer = false;
  }

  // The kafka producers' delivery reports (and errors) make this fd readable.
  int engine_fd = plan.engine_fd, kafka_fd = plan.kafka_fd;
  WaitEventSet* set = nullptr;
  if (engine_fd >= 0) {
    set = kept_wait_set(engine_fd, kafka_fd);
  } else {
    drop_kept_set();
    set = relaybus_wait_event_set(false, nsock + 3);
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (kafka_fd >= 0) AddWaitEventToSet(set, WL_SOCKET_READABLE, kafka_fd, nullptr, nullptr);
    for (int i = 0; i < nsock; i++)
      AddWaitEventToSet(set, (sockets[i].read ? WL_SOCKET_READABLE : 0) | (sockets[i].write ? WL_SOCKET_WRITEABLE : 0),
                        sockets[i].fd, nullptr, nullptr);
  }
  WaitEvent occurred[64];
  int n = WaitEventSetWait(set, timeout_ms, occurred, lengthof(occurred), PG_WAIT_EXTENSION);
  if (engine_fd < 0) FreeWaitEventSet(set);
  bool latch = false;
  for (int i = 0; i < n; i++)
    if (occurred[i].events & WL_LATCH_SET) latch = true;
  if (latch) ResetLatch(MyLatch);
  bool woken = latch || (n == 0 && !engine_timer);  // n == 0: the timeout passed
  if (!running) return woken;
  bool kafka_ready = false;
  SocketWait ready[lengthof(occurred)];
  int nready = 0;
  for (int i = 0; i < n; i++) {
    const WaitEvent& e = occurred[i];
    if (e.fd == kafka_fd && (e.events & WL_SOCKET_READABLE)) kafka_ready = true;
    if (e.fd == kafka_fd || e.fd == PGINVALID_SOCKET) continue;
    ready[nready++] = SocketWait{e.fd, (e.events & WL_SOCKET_READABLE) != 0, (e.events & WL_SOCKET_WRITEABLE) != 0};
  }
  host_after_wait(engine_fd, ready, nready, kafka_ready, n == 0);
  for (int i = 0; i < host_log_count(); i++) ereport(LOG, (errmsg("relaybus dispatcher: %s", host_log_line(i))));
  host_log_clear();
  return woken;
}

void http_shutdown() {
  http_release_queued();
  drop_kept_set();
  host_shutdown();
}

}  // namespace relaybus::pg
