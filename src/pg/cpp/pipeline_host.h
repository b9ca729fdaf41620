// A dispatcher's host of the core delivery pipeline (core/delivery_pipeline.hpp)
// over the HTTP engine and the Kafka producers behind one core::RoutingSink,
// in plain C types: its C++ half (cpp/pipeline_host.cpp) owns the engine, the
// sinks, the pipeline and the staged claims; its glue (http_delivery.cpp)
// claims, settles in SPI, and waits on the latch and the engine's sockets.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pg/cpp/boundary.h"
#include "pg/cpp/catalog_cache.h"

namespace relaybus::pg {

// One claimed delivery to stage (texts copied; payload_json nullptr: null).
struct StageRow {
  int64_t id;
  int64_t event_id;
  const char* topic;
  const char* key;  // nullptr: unkeyed
  int64_t seq;
  int attempt;
  int64_t published_at_ms;   // Unix ms
  int64_t published;         // the store's publish time, handed back with the result
  const char* headers_json;  // nullptr: none
  const char* payload_json;
  uint64_t receipt[2];  // the lease token
};

enum class ResultOutcome { Delivered, Retry, Dead };

// The end of one attempt, as the pipeline judged it (error valid during the call).
struct PipelineResult {
  int64_t id;
  uint64_t receipt[2];
  int handler_key;
  ResultOutcome outcome;
  int64_t retry_in_ms;
  const char* error;  // Retry, Dead: what happened
  int status;
  int64_t breaker_open_until_ms;  // 0: the handler's breaker is closed
  int64_t send_ms;                // core::Completion::send_ms (-1: never went out)
  bool after_gap;                 // core::Completion::after_gap
};

struct ReleasedLease {
  int64_t id;
  uint64_t receipt[2];
};

// The pipeline's store (glue, http_delivery.cpp; each under pg_catch): settles
// results in a transaction of its own; gives back leases never sent.
bool store_complete(const PipelineResult* results, int n, ErrorRecord* err) noexcept;
bool store_release(const ReleasedLease* leases, int n, ErrorRecord* err) noexcept;

// Permits of handlers' limits shared by the database's dispatchers (glue,
// http_delivery.cpp, over worker_state's HandlerLimit table; never an error).
bool shared_limit_acquire(int32_t handler_id, int max_concurrency, double rate, int burst, int64_t now_ms,
                          int64_t* retry_in_ms) noexcept;
void shared_limit_release(int32_t handler_id) noexcept;
void shared_limit_held_back(int32_t handler_id, int waited, int64_t now_ms) noexcept;

// Creates the engine, the sinks and the pipeline, or gives the engine a
// reloaded allow-list (with requests in flight too). False with err->message
// saying why callouts are off.
bool host_ensure(const char* allowlist, int max_in_flight, ErrorRecord* err) noexcept;
bool host_running() noexcept;  // the engine exists
bool host_allowlist_is(const char* allowlist) noexcept;
// How many more deliveries of the handler may be claimed now (0 if unknown).
int host_room(int32_t handler_id, core::HandlerKind kind, const HandlerConfig* config, int64_t now_ms) noexcept;
// Claimed in the open transaction, enqueued once it committed.
bool host_stage(int32_t handler_id, core::HandlerKind kind, const char* name, const HandlerConfig* config,
                const StageRow* rows, int n, int64_t expires_ms, ErrorRecord* err) noexcept;
bool host_enqueue_staged() noexcept;  // false: nothing was staged
void host_drop_staged() noexcept;
size_t host_queued() noexcept;
size_t host_in_flight() noexcept;
size_t host_outstanding(int32_t handler_id) noexcept;  // DeliveryPipeline::outstanding
// These may call the store: false with its error (or the pipeline's) in *err.
bool host_pump(int64_t now_ms, ErrorRecord* err) noexcept;
bool host_release_queued(ErrorRecord* err) noexcept;
bool host_flush(int64_t now_ms, size_t* n, ErrorRecord* err) noexcept;
bool host_flush_paused(int64_t now_ms) noexcept;
size_t host_collect(int64_t now_ms) noexcept;
bool host_completion_due(int64_t now_ms) noexcept;
void host_retain_kafka(const int32_t* ids, int n) noexcept;
void host_shutdown() noexcept;

// Span export (core/span_exporter.hpp) from relaybus.otlp_endpoint and
// relaybus.otlp_headers: each attempt of a traced event the pipeline completes
// becomes a span, sent from this loop.
bool host_otlp_valid(const char* endpoint, const char* headers, char* why, size_t cap) noexcept;
// Creates, replaces (the settings changed) or removes (endpoint empty) the
// exporter; cheap when nothing changed. Invalid settings: off. Returns
// whether there is an exporter now.
bool host_otlp_configure(const char* endpoint, const char* headers) noexcept;
bool host_otlp_on() noexcept;  // an exporter exists
void host_otlp_pump(int64_t now_ms) noexcept;
int64_t host_otlp_wake_in_ms(int64_t now_ms) noexcept;  // -1: nothing waits
struct OtlpCounters {
  uint64_t exported, dropped, failed;
};
// Since the dispatcher started (kept across reloads); false while export is off.
bool host_otlp_counters(OtlpCounters* out) noexcept;
// A failed export's reason, at most once a minute (SpanExporter::take_error).
bool host_otlp_take_error(int64_t now_ms, char* buf, size_t cap) noexcept;
// A NOTIFY of a traced delivery, sent at its transaction's commit: its span
// (core::span_of_notify) is kept until host_otlp_notify_sent (committed: the
// spans go to the exporter) or host_otlp_notify_dropped (aborted: nothing
// was sent). Nothing is kept while export is off.
void host_otlp_stage_notify(const char* handler, const char* channel, int64_t id, int attempt,
                            const char* sent_traceparent, const char* stored_traceparent, bool handed_over) noexcept;
void host_otlp_notify_sent(int64_t now_ms) noexcept;
void host_otlp_notify_dropped() noexcept;

// What to wait on: the engine's ready_fd (or, when it has none, each socket
// of host_wait_sockets), the kafka producers' fd, and when to wake.
struct WaitPlan {
  int engine_fd;              // -1: wait on the sockets
  int kafka_fd;               // -1: none
  int64_t engine_timeout_ms;  // -1: no timer
  int64_t next_probe_ms;      // -1: no breaker probe due
  int64_t kafka_timer_ms;     // from now: a pipelined kafka message times out (the sink's own timeout); -1: none
  int64_t next_permit_ms;     // a delivery held back by its handler's limits may get a permit; -1: none
};
struct SocketWait {
  int fd;
  bool read;
  bool write;
};
int host_socket_count() noexcept;  // 0 while the engine has a ready_fd
// Fills *plan and up to cap sockets (only when there is no ready_fd); returns how many.
int host_wait_plan(int64_t now_ms, SocketWait* sockets, int cap, WaitPlan* plan) noexcept;
// After the wait: the events of the plan's engine_fd and sockets (the kafka
// fd's apart), whether the kafka fd was readable, whether the wait timed out.
void host_after_wait(int engine_fd, const SocketWait* ready, int n, bool kafka_ready, bool timed_out) noexcept;
// librdkafka's log lines since the last clear (valid until then).
int host_log_count() noexcept;
const char* host_log_line(int i) noexcept;
void host_log_clear() noexcept;

}  // namespace relaybus::pg
