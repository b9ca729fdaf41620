#include "pg/http_delivery.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/delivery_pipeline.hpp"
#include "core/http_engine.hpp"
#include "core/kafka_sink.hpp"
#include "core/outbound_policy.hpp"
#include "core/routing_sink.hpp"
#include "pg/cpp/handler_config.hpp"
#include "pg/mixed_boundary.hpp"
#include "pg/pg_compat.hpp"
#include "pg/settle.hpp"
#include "pg/leases.hpp"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"
#include "pg/worker_xact.hpp"

extern "C" {
#include "pgstat.h"
#include "storage/latch.h"
}

namespace relaybus::pg {

namespace {

// The dispatcher's side of core::DeliveryPipeline (queue, claim-ahead, breaker,
// expiry, classification and batching are the pipeline's). Static storage:
// nothing here lives on a stack frame that a PostgreSQL error could unwind.
std::unique_ptr<core::HttpEngine> engine;
std::unique_ptr<core::HttpSink> sink;
// kafka handlers' deliveries: the same pipeline, routed to the producers.
std::unique_ptr<core::KafkaSink> kafka_sink;
std::unique_ptr<core::RoutingSink> router;
std::vector<std::string> kafka_log_lines;  // librdkafka's, logged after each wait
std::unique_ptr<core::DeliveryPipeline> pipeline;
std::string engine_allowlist;
// Claimed in the open transaction: enqueued once it committed.
struct Staged {
  std::shared_ptr<const core::PipelineHandler> handler;
  std::vector<core::ClaimedDelivery> claimed;
  int64 expires_ms;
};
std::vector<Staged> staged;

static_assert(sizeof(LeaseToken) == sizeof(core::Receipt), "a receipt carries a lease token");

int64 now_ms() { return timestamptz_to_epoch_ms(GetCurrentTimestamp()); }

const char* allowlist_setting() { return guc_http_allowlist != nullptr ? guc_http_allowlist : ""; }

// Plain glue (no C++ object lives here): settles a batch in a transaction of
// its own, as the pipeline decided each one. Each is a compare-and-mark on its
// lease token: a dispatcher that lost the lease meanwhile (stalled past it
// while another took over) settles nothing.
void complete_in_xact(const core::Completion* c, int n) {
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
    SettleOutcome outcome = c[i].outcome == core::CompletionOutcome::Delivered ? SettleOutcome::Delivered
                            : c[i].outcome == core::CompletionOutcome::Dead    ? SettleOutcome::Dead
                                                                               : SettleOutcome::Retry;
    if (kafka && outcome != SettleOutcome::Retry) kafka_key_freed = true;
    held[nheld++] =
        settlement_judged(c[i].id, outcome, c[i].retry_in_ms,
                          outcome == SettleOutcome::Delivered ? nullptr : pstrdup(c[i].error.c_str()), c[i].status);
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
void release_leases(const core::ClaimedDelivery* d, int n) {
  int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
  LeaseToken* tokens = static_cast<LeaseToken*>(palloc(sizeof(LeaseToken) * n));
  for (int i = 0; i < n; i++) {
    ids[i] = d[i].message.id;
    memcpy(&tokens[i], &d[i].receipt, sizeof(LeaseToken));
  }
  leases_release(ids, tokens, n);
  pfree(ids);
  pfree(tokens);
}

// The store over SPI and the lease table: PostgreSQL only through pg_guard.
class PgDeliveryStore final : public core::DeliveryStore {
 public:
  void complete(const std::vector<core::Completion>& batch) override {
    const core::Completion* c = batch.data();
    int n = static_cast<int>(batch.size());
    pg_guard([&] { complete_in_xact(c, n); });
  }
  void release(const std::vector<core::ClaimedDelivery>& never_sent) override {
    const core::ClaimedDelivery* d = never_sent.data();
    int n = static_cast<int>(never_sent.size());
    pg_guard([&] { release_leases(d, n); });
  }
};
PgDeliveryStore store;

// Calls the pipeline where it may call the store, from plain glue: a
// PostgreSQL error raised in the store (carried out as PgError) or any C++
// exception is raised here again, once every C++ frame is gone.
template <typename F>
void with_pipeline(F&& f) {
  sigjmp_buf* saved_exception_stack = PG_exception_stack;
  ErrorContextCallback* saved_context_stack = error_context_stack;
  ErrorRecord err;
  if (invoke_cpp(&err, f)) return;
  PG_exception_stack = saved_exception_stack;
  error_context_stack = saved_context_stack;
  raise_error(&err);
}

// Creates the engine and the pipeline, or gives the engine a reloaded
// relaybus.http_allowlist: at once, with requests in flight too (the engine
// checks every connection and every request against the list in force).
// Returns false (with a log line) if the setting is bad.
bool ensure_engine() {
  const char* setting = allowlist_setting();
  char err[kErrLen];
  bool ok = run_core(
      [&](std::string* why) {
        if (engine && engine_allowlist == setting) return true;
        core::HttpEngineOptions opts;
        if (!core::parse_allowlist(setting, &opts.allow, why)) return false;
        if (engine) {
          engine->set_allowlist(opts.allow);
          engine_allowlist = setting;
          return true;
        }
        opts.max_total = std::clamp(guc_max_in_flight, 1, 4096);
        engine = std::make_unique<core::HttpEngine>(opts);
        engine_allowlist = setting;
        if (!engine->ok()) {
          *why = "libcurl could not be initialized";
          engine.reset();
          return false;
        }
        sink = std::make_unique<core::HttpSink>(*engine);
        kafka_sink = std::make_unique<core::KafkaSink>();
        if (!kafka_sink->ok()) {
          *why = "the kafka producers' wake-up pipe could not be made";
          kafka_sink.reset();
          sink.reset();
          engine.reset();
          return false;
        }
        router = std::make_unique<core::RoutingSink>(*sink, *kafka_sink);
        core::PipelineOptions po;
        po.max_in_flight = opts.max_total;
        pipeline = std::make_unique<core::DeliveryPipeline>(*router, po, std::random_device{}());
        return true;
      },
      err);
  if (!ok) ereport(WARNING, (errmsg("relaybus: http callouts are off: %s", err)));
  return ok && engine != nullptr;
}

}  // namespace

int64 http_lease_ms(const HandlerEntry* h) {
  return std::max<int64>(h->config->options.lease_ms, h->config->options.timeout_ms + guc_http_lease_margin_ms);
}

int http_capacity(const HandlerEntry* h) {
  if (!ensure_engine()) return 0;
  int capacity = 0;
  int64 now = now_ms();
  char err[kErrLen];
  (void)run_core(
      [&](std::string*) {
        router->set_kind(h->id, h->kind);
        capacity = pipeline->room(h->id, h->config->options.concurrency, now);
        return true;
      },
      err);
  return capacity;
}

void http_stage(const HandlerEntry* h, const ClaimResult* res) {
  if (res->n == 0) return;
  // The texts the requests need, in plain memory first.
  struct Row {
    char *payload, *headers;
  };
  int n = res->n;
  auto* rows = static_cast<Row*>(palloc(sizeof(Row) * n));
  for (int i = 0; i < n; i++) {
    const ClaimedRow& c = res->rows[i];
    rows[i].payload = c.payload != nullptr ? JsonbToCString(nullptr, &c.payload->root, VARSIZE(c.payload)) : nullptr;
    rows[i].headers = c.headers != nullptr ? JsonbToCString(nullptr, &c.headers->root, VARSIZE(c.headers)) : nullptr;
  }
  int64 now = now_ms();
  // A queued request must still be sent, and answered within its timeout,
  // while its lease holds (http_lease_ms), with half the lease margin to
  // spare for the completing transaction: else it is not sent and its lease
  // goes back.
  int64 expires =
      now + std::max<int64>(1000, http_lease_ms(h) - h->config->options.timeout_ms - guc_http_lease_margin_ms / 2);
  char err[kErrLen];
  if (!run_core(
          [&](std::string*) {
            auto handler = std::make_shared<core::PipelineHandler>();
            handler->key = h->id;
            handler->kind = h->kind;
            handler->name = h->name;
            handler->target = h->config->target;
            handler->options = h->config->options;
            Staged s{std::move(handler), {}, expires};
            s.claimed.reserve(n);
            for (int i = 0; i < n; i++) {
              const ClaimedRow& r = res->rows[i];
              core::ClaimedDelivery d;
              d.message.id = r.id;
              d.message.event_id = r.event_id;
              d.message.topic = r.topic;
              d.message.has_key = r.key != nullptr;
              if (r.key != nullptr) d.message.key = r.key;
              d.message.seq = r.seq;
              d.message.attempt = r.attempt;
              d.message.published_at_ms = timestamptz_to_epoch_ms(r.published_at);
              if (rows[i].headers != nullptr) d.message.headers_json = rows[i].headers;
              d.message.payload_json = rows[i].payload != nullptr ? rows[i].payload : "null";
              memcpy(static_cast<void*>(&d.receipt), &r.token, sizeof(LeaseToken));
              d.published = r.published_at;
              s.claimed.push_back(std::move(d));
            }
            staged.push_back(std::move(s));
            return true;
          },
          err))
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("relaybus could not prepare http requests: %s", err)));
}

void http_send_staged() {
  if (staged.empty()) return;
  char err[kErrLen];
  (void)run_core(
      [&](std::string*) {
        for (auto& s : staged) pipeline->enqueue(s.handler, std::move(s.claimed), s.expires_ms);
        staged.clear();
        return true;
      },
      err);
  http_pump();
}

void http_pump() {
  if (!pipeline || pipeline->queued() == 0) return;
  // A reloaded allow-list applies to these requests already.
  if (engine_allowlist != allowlist_setting()) (void)ensure_engine();
  int64 now = now_ms();
  with_pipeline([&] { pipeline->pump(store, now); });
}

void http_release_queued() {
  if (!pipeline) return;
  with_pipeline([&] { pipeline->release_queued(store); });
}

void http_drop_staged() {
  // Their leases went with the aborted transaction.
  char err[kErrLen];
  (void)run_core(
      [&](std::string*) {
        staged.clear();
        return true;
      },
      err);
}

size_t http_in_flight() { return router ? router->in_flight() : 0; }

void http_retain_kafka(const int32* ids, int n) {
  if (!kafka_sink) return;
  char err[kErrLen];
  (void)run_core(
      [&](std::string*) {
        kafka_sink->retain_handlers(std::vector<int>(ids, ids + n));
        return true;
      },
      err);
}

int http_collect() {
  if (!pipeline) return 0;
  int64 now = now_ms();
  size_t n = 0;
  char err[kErrLen];
  (void)run_core(
      [&](std::string*) {
        n = pipeline->collect(now);
        return true;
      },
      err);
  return static_cast<int>(n);
}

bool http_completion_due() {
  if (!pipeline) return false;
  int64 now = now_ms();
  bool due = false;
  char err[kErrLen];
  (void)run_core(
      [&](std::string*) {
        due = pipeline->completion_due(now);
        return true;
      },
      err);
  return due;
}

int http_complete() {
  if (http_collect() == 0) return 0;
  int64 now = now_ms();
  if (pipeline->flush_paused(now)) return 0;
  size_t n = 0;
  with_pipeline([&] { n = pipeline->flush(store, now); });
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
  int nsock = 0;
  int* fds = nullptr;
  uint32* events = nullptr;
  int64 engine_timeout = -1;
  int64 next_probe = -1;
  int64 nowms = now_ms();
  int engine_fd = -1;
  if (engine) {
    size_t cap = 0;
    char err[kErrLen];
    engine_fd = engine->ready_fd();
    if (engine_fd < 0)
      (void)run_core(
          [&](std::string*) {
            cap = engine->sockets().size();
            return true;
          },
          err);
    fds = static_cast<int*>(palloc(sizeof(int) * (cap + 1)));
    events = static_cast<uint32*>(palloc(sizeof(uint32) * (cap + 1)));
    (void)run_core(
        [&](std::string*) {
          if (engine_fd < 0)
            for (const auto& w : engine->sockets()) {
              uint32 ev = (w.read ? WL_SOCKET_READABLE : 0) | (w.write ? WL_SOCKET_WRITEABLE : 0);
              if (ev == 0 || nsock >= static_cast<int>(cap)) continue;
              fds[nsock] = w.fd;
              events[nsock++] = ev;
            }
          engine_timeout = engine->timeout_ms();
          next_probe = pipeline->next_probe_ms(nowms);
          return true;
        },
        err);
  }
  // libcurl's own timers (often 0 or 1 ms while transfers run) end the wait
  // too, but they are the engine's business: they do not call for a claim or
  // a completion, so they do not count as a wake-up.
  bool engine_timer = false;
  if (engine_timeout >= 0 && engine_timeout < timeout_ms) {
    timeout_ms = static_cast<long>(engine_timeout);
    engine_timer = true;
  }
  // An open breaker lets its probe through when its backoff ends.
  if (next_probe >= 0 && next_probe - nowms + 1 < timeout_ms) {
    timeout_ms = static_cast<long>(next_probe - nowms + 1);
    engine_timer = false;
  }

  // The kafka producers' delivery reports (and errors) make this fd readable.
  int kafka_fd = kafka_sink ? kafka_sink->wait_fd() : -1;
  WaitEventSet* set = nullptr;
  if (engine_fd >= 0) {
    set = kept_wait_set(engine_fd, kafka_fd);
  } else {
    drop_kept_set();
    set = relaybus_wait_event_set(false, nsock + 3);
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (kafka_fd >= 0) AddWaitEventToSet(set, WL_SOCKET_READABLE, kafka_fd, nullptr, nullptr);
    for (int i = 0; i < nsock; i++) AddWaitEventToSet(set, events[i], fds[i], nullptr, nullptr);
  }
  WaitEvent occurred[64];
  int n = WaitEventSetWait(set, timeout_ms, occurred, lengthof(occurred), PG_WAIT_EXTENSION);
  if (engine_fd < 0) FreeWaitEventSet(set);
  bool latch = false;
  for (int i = 0; i < n; i++)
    if (occurred[i].events & WL_LATCH_SET) latch = true;
  if (latch) ResetLatch(MyLatch);
  bool woken = latch || (n == 0 && !engine_timer);  // n == 0: the timeout passed
  if (!engine) return woken;
  bool kafka_ready = false;
  for (int i = 0; i < n; i++)
    if (occurred[i].fd == kafka_fd && (occurred[i].events & WL_SOCKET_READABLE)) kafka_ready = true;
  char err[kErrLen];
  (void)run_core(
      [&](std::string*) {
        // Served here, on this thread: the reports become results that
        // the loop collects next; librdkafka's lines go to the server log.
        if (kafka_ready) {
          kafka_sink->poll();
          kafka_log_lines = kafka_sink->take_log();
        }
        core::HttpEngine::Batch batch;
        for (int i = 0; i < n; i++) {
          const WaitEvent& e = occurred[i];
          if (e.fd == kafka_fd || e.fd == PGINVALID_SOCKET) continue;
          if (engine_fd >= 0 && e.fd == engine_fd)
            engine->on_ready();
          else if (e.events & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE))
            engine->on_socket(e.fd, (e.events & WL_SOCKET_READABLE) != 0, (e.events & WL_SOCKET_WRITEABLE) != 0);
        }
        if (engine->timeout_ms() == 0 || n == 0) engine->on_timeout();
        return true;
      },
      err);
  for (const std::string& line : kafka_log_lines) ereport(LOG, (errmsg("relaybus dispatcher: %s", line.c_str())));
  kafka_log_lines.clear();
  return woken;
}

void http_shutdown() {
  http_release_queued();
  drop_kept_set();
  char err[kErrLen];
  (void)run_core(
      [&](std::string*) {
        pipeline.reset();
        router.reset();
        kafka_sink.reset();
        sink.reset();
        engine.reset();
        return true;
      },
      err);
}

}  // namespace relaybus::pg
