#pragma once

// OTLP/HTTP span export: one span per delivery attempt of a traced event, a
// child of the publisher's span (docs/tracing.md, "Spans"). The delivery
// pipeline hands each finished attempt to add() (DeliveryPipeline::
// set_span_exporter); the host's single-threaded loop calls pump() every pass
// and bounds its sleep by wake_in_ms(). The exporter has its own libcurl
// multi handle (an HttpEngine of its own), at most one request in flight and
// a bounded queue: it never blocks the loop, and when the collector is slow,
// down or refuses, spans are dropped and counted, never retried into a
// growing backlog. Not thread-safe: one exporter, one thread.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "handler_kind.hpp"

namespace relaybus::core {

class HttpEngine;
struct Completion;
struct PipelineHandler;

// One finished attempt, as its span shows it.
struct SpanRecord {
  std::string trace_id;        // 32 hex
  std::string span_id;         // 16 hex: the attempt's own (the traceparent it sent)
  std::string parent_span_id;  // 16 hex: the publisher's span
  std::string handler;
  HandlerKind kind = HandlerKind::Http;
  std::string destination;  // kafka: the topic; notify: the channel; http: empty
  int64_t delivery_id = 0;
  int attempt = 0;
  std::string outcome;  // completion_outcome_name: delivered, retry, dead; notify: delivered, notified
  bool failed = false;  // anything but delivered: status ERROR
  std::string error;
  int64_t queue_ms = -1;  // claimed to sent (-1: unknown)
  int64_t send_ms = -1;   // sent to its result (-1: never reached the sink)
  int64_t start_unix_nano = 0;
  int64_t end_unix_nano = 0;
  int http_status = 0;           // 0: none
  int32_t kafka_partition = -1;  // -1: none
  int64_t kafka_offset = -1;
};

// The span of a completion, or false if it carries no trace context (no
// parent to join: no span). Ends now by the wall clock; starts send_ms before.
bool span_of_completion(const Completion& c, const PipelineHandler& handler, SpanRecord* out);

// A NOTIFY a dispatcher sent for a traced delivery, as its span: sent is the
// traceparent the payload carried (its span id is the span's), stored the
// publisher's (the parent). handed_over: the notification waits for
// relay_ack (ack mode, or a payload sent by reference), outcome "notified";
// else the NOTIFY completed it, "delivered". Starts at claim_unix_nano,
// ends at sent_unix_nano (the commit that sent it); false if either
// traceparent is not well-formed.
struct NotifyAttempt {
  std::string_view sent_traceparent;
  std::string_view stored_traceparent;
  std::string_view handler;
  std::string_view channel;
  int64_t delivery_id = 0;
  int attempt = 0;
  bool handed_over = false;
  int64_t claim_unix_nano = 0;
  int64_t sent_unix_nano = 0;
};
bool span_of_notify(const NotifyAttempt& a, SpanRecord* out);

// The wall clock in OTLP's unit.
int64_t unix_nano_now();

// ExportTraceServiceRequest in OTLP's JSON mapping: one resource
// (service.name "relaybus", relaybus.edition), one scope, these spans.
std::string otlp_traces_json(const std::vector<std::string>& span_objects, std::string_view edition);
// One span as an OTLP JSON object (otlp_traces_json's element).
std::string otlp_span_json(const SpanRecord& span);

// "http(s)://host:port[/path]" -> the traces URL: "/v1/traces" appended to a
// base without it (as OTEL_EXPORTER_OTLP_ENDPOINT); false with *why otherwise.
bool otlp_traces_url(std::string_view endpoint, std::string* url, std::string* why);
// "name=value,name2=value2" (OTEL_EXPORTER_OTLP_HEADERS' form, spaces around
// items trimmed); false with *why for an item without '=' or a bad name/value.
bool parse_otlp_headers(std::string_view text, std::vector<std::pair<std::string, std::string>>* out, std::string* why);

struct SpanExporterOptions {
  std::string endpoint;  // base or full traces URL (otlp_traces_url)
  std::vector<std::pair<std::string, std::string>> headers;
  std::string edition;            // relaybus.edition: "extension", "agent", "mongo"
  size_t max_queue = 2048;        // spans waiting; beyond, add() drops
  size_t max_batch = 512;         // spans per request
  int64_t batch_delay_ms = 1000;  // the oldest waiting span goes out at most this late
  int64_t timeout_ms = 2000;      // per request, connecting included
};

class SpanExporter {
 public:
  // Check the endpoint with otlp_traces_url first: a bad one makes every
  // batch fail (and count as dropped).
  explicit SpanExporter(SpanExporterOptions options);
  ~SpanExporter();
  SpanExporter(const SpanExporter&) = delete;
  SpanExporter& operator=(const SpanExporter&) = delete;

  const SpanExporterOptions& options() const { return options_; }
  // Queues a span; false (counted as dropped) when the queue is full.
  bool add(const SpanRecord& span, int64_t now_ms);
  // The completion's span, if it has trace context (span_of_completion).
  void add_completion(const Completion& c, const PipelineHandler& handler, int64_t now_ms);
  // Serves the request in flight (never waits) and sends the next batch when
  // one is due and none is in flight. now_ms: the caller's clock, the same
  // one as add()'s.
  void pump(int64_t now_ms);
  // How long the loop may sleep before pump() has something to do: -1
  // (nothing waits), 0 (now), or ms. A request in flight is polled (at most
  // every kPollMs), so that a host's wait set need not watch its sockets.
  int64_t wake_in_ms(int64_t now_ms) const;
  static constexpr int64_t kPollMs = 20;

  uint64_t exported() const { return exported_; }  // spans the collector accepted (2xx)
  uint64_t dropped() const { return dropped_; }    // spans lost: queue full, or their request failed
  uint64_t failed() const { return failed_; }      // requests that failed
  size_t queued() const { return queue_.size(); }
  bool in_flight() const { return in_flight_ > 0; }
  // The last failed request's reason, once per minute at most (for the
  // host's log); empty otherwise.
  std::string take_error(int64_t now_ms);

 private:
  void serve();
  void send_batch();

  SpanExporterOptions options_;
  std::string url_;
  std::string url_error_;
  std::unique_ptr<HttpEngine> engine_;
  struct Waiting {
    std::string json;
    int64_t added_ms;
  };
  std::deque<Waiting> queue_;
  size_t in_flight_ = 0;  // spans in the request in flight
  uint64_t next_tag_ = 1;
  uint64_t exported_ = 0, dropped_ = 0, failed_ = 0;
  std::string error_;
  int64_t error_logged_ms_ = -1;
};

}  // namespace relaybus::core
