#include "pg/cpp/pipeline_host.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/delivery_pipeline.hpp"
#include "core/http_engine.hpp"
#include "core/kafka_sink.hpp"
#include "core/outbound_policy.hpp"
#include "core/routing_sink.hpp"
#include "core/span_exporter.hpp"
#include "pg/cpp/handler_config.hpp"
#include "pg/cpp/invoke.hpp"

namespace relaybus::pg {

namespace {

static_assert(sizeof(core::Receipt) == sizeof(uint64_t[2]), "a receipt carries a lease token");

// The dispatcher's side of core::DeliveryPipeline (queue, claim-ahead, breaker,
// expiry, classification and batching are the pipeline's).
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
  int64_t expires_ms;
};
std::vector<Staged> staged;
// relaybus.otlp_endpoint's exporter, and the settings it was made from.
std::unique_ptr<core::SpanExporter> exporter;
std::string exporter_endpoint, exporter_headers;
OtlpCounters exporter_base{0, 0, 0};
// Spans of NOTIFYs whose transaction has not committed yet.
std::vector<core::SpanRecord> staged_notify_spans;

// The store over SPI and the lease table: PostgreSQL only through the glue
// (pg_call). The plain arrays are kept across batches.
class PgDeliveryStore final : public core::DeliveryStore {
 public:
  void complete(const std::vector<core::Completion>& batch) override {
    results_.clear();
    results_.reserve(batch.size());
    for (const core::Completion& c : batch) {
      PipelineResult r;
      r.id = c.id;
      std::memcpy(r.receipt, &c.receipt, sizeof(r.receipt));
      r.handler_key = c.handler_key;
      r.outcome = c.outcome == core::CompletionOutcome::Delivered ? ResultOutcome::Delivered
                  : c.outcome == core::CompletionOutcome::Dead    ? ResultOutcome::Dead
                                                                  : ResultOutcome::Retry;
      r.retry_in_ms = c.retry_in_ms;
      r.error = c.error.c_str();
      r.status = c.status;
      r.breaker_open_until_ms = c.breaker_open_until_ms;
      r.send_ms = c.send_ms;
      r.after_gap = c.after_gap;
      results_.push_back(r);
    }
    const int n = static_cast<int>(results_.size());
    pg_call([&](ErrorRecord* err) { return store_complete(results_.data(), n, err); });
  }
  void release(const std::vector<core::ClaimedDelivery>& never_sent) override {
    released_.clear();
    released_.reserve(never_sent.size());
    for (const core::ClaimedDelivery& d : never_sent) {
      ReleasedLease l;
      l.id = d.message.id;
      std::memcpy(l.receipt, &d.receipt, sizeof(l.receipt));
      released_.push_back(l);
    }
    const int n = static_cast<int>(released_.size());
    pg_call([&](ErrorRecord* err) { return store_release(released_.data(), n, err); });
  }

 private:
  std::vector<PipelineResult> results_;
  std::vector<ReleasedLease> released_;
};
PgDeliveryStore store;

// The shared-memory permits (worker_state.hpp HandlerLimit) through the glue.
class PgLimiter final : public core::HandlerLimiter {
 public:
  bool acquire(const core::PipelineHandler& h, int64_t now_ms, int64_t* retry_in_ms) override {
    return shared_limit_acquire(h.key, h.options.max_concurrency, h.options.rate, core::effective_burst(h.options),
                                now_ms, retry_in_ms);
  }
  void release(const core::PipelineHandler& h) override { shared_limit_release(h.key); }
  void held_back(const core::PipelineHandler& h, int waited, int64_t now_ms) override {
    shared_limit_held_back(h.key, waited, now_ms);
  }
};
PgLimiter limiter;

// For the calls whose failure changes nothing (the old answer stands).
template <typename F>
void quietly(F&& f) noexcept {
  ErrorRecord ignored;
  (void)invoke_cpp(&ignored, f);
}

}  // namespace

bool host_ensure(const char* setting, int max_in_flight, ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    if (engine && engine_allowlist == setting) return;
    core::HttpEngineOptions opts;
    std::string why;
    if (!core::parse_allowlist(setting, &opts.allow, &why))
      throw std::runtime_error(why.empty() ? "invalid value" : why);
    if (engine) {
      engine->set_allowlist(opts.allow);
      engine_allowlist = setting;
      return;
    }
    opts.max_total = std::clamp(max_in_flight, 1, core::kMaxHandlerInFlight);
    engine = std::make_unique<core::HttpEngine>(opts);
    engine_allowlist = setting;
    if (!engine->ok()) {
      engine.reset();
      throw std::runtime_error("libcurl could not be initialized");
    }
    sink = std::make_unique<core::HttpSink>(*engine);
    kafka_sink = std::make_unique<core::KafkaSink>();
    // This loop polls the sink by its deadlines (host_wait_plan, host_after_wait).
    kafka_sink->set_pipelined(true);
    if (!kafka_sink->ok()) {
      kafka_sink.reset();
      sink.reset();
      engine.reset();
      throw std::runtime_error("the kafka producers' wake-up pipe could not be made");
    }
    router = std::make_unique<core::RoutingSink>(*sink, *kafka_sink);
    core::PipelineOptions po;
    po.max_in_flight = opts.max_total;
    pipeline = std::make_unique<core::DeliveryPipeline>(*router, po, std::random_device{}());
    pipeline->set_limiter(&limiter);
    pipeline->set_span_exporter(exporter.get());
  });
}

bool host_running() noexcept { return engine != nullptr; }

bool host_allowlist_is(const char* setting) noexcept { return engine_allowlist == setting; }

int host_room(int32_t handler_id, core::HandlerKind kind, const HandlerConfig* config, int64_t now_ms) noexcept {
  int capacity = 0;
  quietly([&] {
    router->set_kind(handler_id, kind);
    capacity =
        pipeline->room(handler_id, core::handler_in_flight_limit(kind, config->options), config->options, now_ms);
  });
  return capacity;
}

bool host_stage(int32_t handler_id, core::HandlerKind kind, const char* name, const HandlerConfig* config,
                const StageRow* rows, int n, int64_t expires_ms, ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] {
    auto handler = std::make_shared<core::PipelineHandler>();
    handler->key = handler_id;
    handler->kind = kind;
    handler->name = name;
    handler->target = config->target;
    handler->options = config->options;
    handler->options.concurrency = core::handler_in_flight_limit(kind, config->options);
    Staged s{std::move(handler), {}, expires_ms};
    s.claimed.reserve(n);
    for (int i = 0; i < n; i++) {
      const StageRow& r = rows[i];
      core::ClaimedDelivery d;
      d.message.id = r.id;
      d.message.event_id = r.event_id;
      d.message.topic = r.topic;
      d.message.has_key = r.key != nullptr;
      if (r.key != nullptr) d.message.key = r.key;
      d.message.seq = r.seq;
      d.message.attempt = r.attempt;
      d.message.published_at_ms = r.published_at_ms;
      if (r.headers_json != nullptr) d.message.headers_json = r.headers_json;
      d.message.payload_json = r.payload_json != nullptr ? r.payload_json : "null";
      std::memcpy(static_cast<void*>(&d.receipt), r.receipt, sizeof(r.receipt));
      d.published = r.published;
      s.claimed.push_back(std::move(d));
    }
    staged.push_back(std::move(s));
  });
}

bool host_enqueue_staged() noexcept {
  if (staged.empty()) return false;
  quietly([&] {
    for (auto& s : staged) pipeline->enqueue(s.handler, std::move(s.claimed), s.expires_ms);
    staged.clear();
  });
  return true;
}

void host_drop_staged() noexcept {
  quietly([&] { staged.clear(); });
}

size_t host_queued() noexcept { return pipeline ? pipeline->queued() : 0; }

size_t host_in_flight() noexcept { return router ? router->in_flight() : 0; }

size_t host_outstanding(int32_t handler_id) noexcept { return pipeline ? pipeline->outstanding(handler_id) : 0; }

bool host_pump(int64_t now_ms, ErrorRecord* err) noexcept {
  return invoke_cpp(err, [&] { pipeline->pump(store, now_ms); });
}

bool host_release_queued(ErrorRecord* err) noexcept {
  if (!pipeline) return true;
  return invoke_cpp(err, [&] { pipeline->release_queued(store); });
}

bool host_flush(int64_t now_ms, size_t* n, ErrorRecord* err) noexcept {
  *n = 0;
  return invoke_cpp(err, [&] { *n = pipeline->flush(store, now_ms); });
}

bool host_flush_paused(int64_t now_ms) noexcept {
  bool paused = false;
  quietly([&] { paused = pipeline->flush_paused(now_ms); });
  return paused;
}

size_t host_collect(int64_t now_ms) noexcept {
  if (!pipeline) return 0;
  size_t n = 0;
  quietly([&] { n = pipeline->collect(now_ms); });
  return n;
}

bool host_completion_due(int64_t now_ms) noexcept {
  if (!pipeline) return false;
  bool due = false;
  quietly([&] { due = pipeline->completion_due(now_ms); });
  return due;
}

void host_retain_kafka(const int32_t* ids, int n) noexcept {
  if (!kafka_sink) return;
  quietly([&] { kafka_sink->retain_handlers(std::vector<int>(ids, ids + n)); });
}

void host_shutdown() noexcept {
  quietly([&] {
    pipeline.reset();
    exporter.reset();
    router.reset();
    kafka_sink.reset();
    sink.reset();
    engine.reset();
  });
}

int host_socket_count() noexcept {
  int count = 0;
  quietly([&] { count = engine && engine->ready_fd() < 0 ? static_cast<int>(engine->sockets().size()) : 0; });
  return count;
}

int host_wait_plan(int64_t now_ms, SocketWait* sockets, int cap, WaitPlan* plan) noexcept {
  *plan = WaitPlan{-1, kafka_sink ? kafka_sink->wait_fd() : -1, -1, -1, -1, -1};
  if (!engine) return 0;
  int nsock = 0;
  plan->engine_fd = engine->ready_fd();
  quietly([&] {
    if (plan->engine_fd < 0)
      for (const auto& w : engine->sockets()) {
        if ((!w.read && !w.write) || nsock >= cap) continue;
        sockets[nsock++] = SocketWait{w.fd, w.read, w.write};
      }
    plan->engine_timeout_ms = engine->timeout_ms();
    plan->next_probe_ms = pipeline->next_probe_ms(now_ms);
    plan->kafka_timer_ms = kafka_sink->next_deadline_in_ms();
    plan->next_permit_ms = pipeline->next_permit_ms();
  });
  return nsock;
}

void host_after_wait(int engine_fd, const SocketWait* ready, int n, bool kafka_ready, bool timed_out) noexcept {
  if (!engine) return;
  quietly([&] {
    // Served here, on this thread: the reports become results that the loop
    // collects next; librdkafka's lines go to the server log.
    if (kafka_ready || kafka_sink->next_deadline_in_ms() == 0) kafka_sink->poll();
    // Lines written while results were taken (collect) too, not only by the
    // poll above: a run's last report may come with no later wake-up.
    for (std::string& line : kafka_sink->take_log()) kafka_log_lines.push_back(std::move(line));
    for (int i = 0; i < n; i++) {
      if (engine_fd >= 0 && ready[i].fd == engine_fd)
        engine->on_ready();
      else if (ready[i].read || ready[i].write)
        engine->on_socket(ready[i].fd, ready[i].read, ready[i].write);
    }
    if (engine->timeout_ms() == 0 || timed_out) engine->on_timeout();
  });
}

int host_log_count() noexcept { return static_cast<int>(kafka_log_lines.size()); }

const char* host_log_line(int i) noexcept { return kafka_log_lines[static_cast<size_t>(i)].c_str(); }

void host_log_clear() noexcept { kafka_log_lines.clear(); }

}  // namespace relaybus::pg

namespace relaybus::pg {

namespace {

void copy_text(const std::string& s, char* buf, size_t cap) {
  if (cap == 0) return;
  const size_t n = std::min(s.size(), cap - 1);
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}

}  // namespace

bool host_otlp_valid(const char* endpoint, const char* headers, char* why, size_t cap) noexcept {
  bool ok = false;
  ErrorRecord err;
  if (!invoke_cpp(&err, [&] {
        std::string url, reason;
        std::vector<std::pair<std::string, std::string>> parsed;
        ok = (endpoint == nullptr || *endpoint == '\0' || core::otlp_traces_url(endpoint, &url, &reason)) &&
             (headers == nullptr || core::parse_otlp_headers(headers, &parsed, &reason));
        if (!ok) copy_text(reason, why, cap);
      }))
    copy_text(err.message, why, cap);
  return ok;
}

bool host_otlp_configure(const char* endpoint, const char* headers) noexcept {
  const char* e = endpoint != nullptr ? endpoint : "";
  const char* h = headers != nullptr ? headers : "";
  // Off and staying off, every loop pass: nothing to compare.
  if (exporter == nullptr && *e == '\0' && exporter_endpoint.empty()) return false;
  if ((exporter != nullptr) == (*e != '\0') && exporter_endpoint == e && exporter_headers == h)
    return exporter != nullptr;
  quietly([&] {
    if (exporter) {
      exporter_base.exported += exporter->exported();
      exporter_base.dropped += exporter->dropped() + exporter->queued();
      exporter_base.failed += exporter->failed();
    }
    if (pipeline) pipeline->set_span_exporter(nullptr);
    exporter.reset();
    exporter_endpoint = e;
    exporter_headers = h;
    core::SpanExporterOptions o;
    std::string why;
    if (*e == '\0' || !core::parse_otlp_headers(h, &o.headers, &why)) return;
    o.endpoint = e;
    o.edition = "extension";
    exporter = std::make_unique<core::SpanExporter>(std::move(o));
    if (pipeline) pipeline->set_span_exporter(exporter.get());
  });
  return exporter != nullptr;
}

bool host_otlp_on() noexcept { return exporter != nullptr; }

void host_otlp_pump(int64_t now_ms) noexcept {
  if (exporter) quietly([&] { exporter->pump(now_ms); });
}

int64_t host_otlp_wake_in_ms(int64_t now_ms) noexcept { return exporter ? exporter->wake_in_ms(now_ms) : -1; }

bool host_otlp_counters(OtlpCounters* out) noexcept {
  if (!exporter) return false;
  out->exported = exporter_base.exported + exporter->exported();
  out->dropped = exporter_base.dropped + exporter->dropped();
  out->failed = exporter_base.failed + exporter->failed();
  return true;
}

bool host_otlp_take_error(int64_t now_ms, char* buf, size_t cap) noexcept {
  bool any = false;
  if (exporter)
    quietly([&] {
      const std::string e = exporter->take_error(now_ms);
      any = !e.empty();
      if (any) copy_text(e, buf, cap);
    });
  return any;
}

void host_otlp_stage_notify(const char* handler, const char* channel, int64_t id, int attempt,
                            const char* sent_traceparent, const char* stored_traceparent, bool handed_over) noexcept {
  if (!exporter) return;
  quietly([&] {
    core::NotifyAttempt a;
    a.sent_traceparent = sent_traceparent;
    a.stored_traceparent = stored_traceparent;
    a.handler = handler;
    a.channel = channel;
    a.delivery_id = id;
    a.attempt = attempt;
    a.handed_over = handed_over;
    a.claim_unix_nano = core::unix_nano_now();
    core::SpanRecord span;
    if (core::span_of_notify(a, &span)) staged_notify_spans.push_back(std::move(span));
  });
}

void host_otlp_notify_sent(int64_t now_ms) noexcept {
  if (staged_notify_spans.empty()) return;
  quietly([&] {
    const int64_t sent = core::unix_nano_now();
    for (core::SpanRecord& s : staged_notify_spans) {
      s.end_unix_nano = sent;
      s.queue_ms = std::max<int64_t>(0, (sent - s.start_unix_nano) / 1000000);
      if (exporter) (void)exporter->add(s, now_ms);
    }
  });
  staged_notify_spans.clear();
}

void host_otlp_notify_dropped() noexcept { staged_notify_spans.clear(); }

}  // namespace relaybus::pg
