#pragma once

// THE delivery pipeline of the PostgreSQL dispatchers and relaybus-mongo:
// claimed deliveries wait in its queue, go out to a sink (the HTTP engine)
// under their handler's concurrency and circuit breaker, come back as
// results, are classified (delivered / retry after a delay / dead letter) and
// handed to the store in batches. Both sides drive it from their own single-
// threaded loop; only claiming and the store's writes are theirs.
//
//   store side                     core (this file)                    sink
//   ----------                     ----------------                    ----
//   room() -> claim N  ---------> enqueue(claimed, receipts)
//                                  pump(): expired / breaker-tripped
//   DeliveryStore::release  <----  deliveries are given back; the
//                                  rest are built and submitted  ----> submit()
//                                  collect(): results, breaker,  <---- take_results()
//                                  classification into Completions
//   DeliveryStore::complete <----  flush(): a batch (16, or 2 ms)
//     (compare-and-release on each receipt: a stale receipt changes nothing)
//
// The pipeline never calls the store except through flush(), pump() and
// release_queued(), and never from inside another call of the store: a store
// may throw (a PostgreSQL error carried out as an exception, a MongoDB
// error), the pipeline stays consistent and the exception goes to the caller.
// Not thread-safe: one pipeline, one thread.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "handler_config.hpp"
#include "http_engine.hpp"
#include "span_exporter.hpp"
#include "webhook_delivery.hpp"

namespace relaybus::core {

// What the store needs to fence a completion, opaque to the pipeline: on
// PostgreSQL the 16 bytes of the lease token, on MongoDB the lane and the
// epoch at which this instance took it.
struct Receipt {
  uint64_t a = 0;
  uint64_t b = 0;
  bool operator==(const Receipt& o) const { return a == o.a && b == o.b; }
};

// A handler as it was when its deliveries were claimed (the catalog may
// change before they go out). key: the handler's number (the engine's
// concurrency group and the results' handler_key).
struct PipelineHandler {
  int key = 0;
  HandlerKind kind = HandlerKind::Http;  // which sink a RoutingSink gives it to
  std::string name;
  std::string target;
  HandlerOptions options;
};

struct ClaimedDelivery {
  WebhookMessage message;  // message.attempt: this attempt, 1 = the first
  Receipt receipt;
  int64_t published = 0;  // the store's publish time, handed back in the Completion (latency)
};

enum class CompletionOutcome { Delivered, Retry, Dead };
const char* completion_outcome_name(CompletionOutcome o);  // "delivered", "retry", "dead"

// The end of one attempt, for the store to record on its receipt.
struct Completion {
  int64_t id = 0;
  Receipt receipt;
  int handler_key = 0;
  std::string handler;  // PipelineHandler::name
  CompletionOutcome outcome = CompletionOutcome::Delivered;
  int64_t retry_in_ms = 0;            // Retry: from now (Retry-After, clamped, or the backoff)
  std::string error;                  // Retry / Dead: what happened ("HTTP 500", "timeout after ...")
  int status = 0;                     // HTTP status; 0 = none
  int64_t published = 0;              // ClaimedDelivery::published
  int64_t breaker_open_until_ms = 0;  // the handler's breaker after this result; 0 = closed
  // From handing the attempt to the sink to its result (an HTTP exchange, a
  // Kafka produce to its acknowledgement); -1: it never reached the sink.
  int64_t send_ms = -1;
  bool after_gap = false;  // HttpResult::after_gap
  // The attempt's traceparent (its trace-id and its own span id) and the
  // publisher's span it is a child of (16 hex); empty: no trace context.
  std::string traceparent;
  std::string parent_span_id;
  int attempt = 0;               // ClaimedDelivery's message.attempt
  int64_t queue_ms = -1;         // from enqueue to the sink (-1: unknown)
  int32_t kafka_partition = -1;  // HttpResult::kafka_partition
  int64_t kafka_offset = -1;
};

// One result classified with the shared rules: success is Delivered; a
// permanent failure (webhook_failure_is_permanent) or the last attempt
// (attempt >= max_attempts) is Dead; anything else is Retry after the
// Retry-After the engine clamped (clamp_retry_after_ms, again here so that
// any sink's value is bounded) or the handler's backoff with full jitter.
Completion classify_result(const PipelineHandler& handler, const HttpResult& result, int attempt, uint64_t random64);

// Where requests go: the HTTP engine today, a Kafka producer later. Results
// come back tagged with the delivery id (HttpResult::tag).
class DeliverySink {
 public:
  virtual ~DeliverySink() = default;
  virtual void set_handler_limit(int key, int concurrency) = 0;
  virtual bool can_submit(int key) const = 0;
  virtual size_t in_flight() const = 0;
  virtual size_t in_flight(int key) const = 0;
  // Builds the request of this attempt now (timestamp and signature of
  // now_ms) and starts it. False (with *why) if refused: no result comes.
  virtual bool submit(const PipelineHandler& handler, const WebhookMessage& message, int64_t now_ms,
                      std::string* why) = 0;
  virtual std::vector<HttpResult> take_results() = 0;
  virtual void cancel_all() = 0;
  // Around a run of submits (the pipeline calls nothing else in between).
  virtual void begin_submits() {}
  virtual void end_submits() {}
};

// The HTTP engine as a sink: requests made by build_webhook_request.
class HttpSink final : public DeliverySink {
 public:
  explicit HttpSink(HttpEngine& engine) : engine_(engine) {}
  void set_handler_limit(int key, int concurrency) override { engine_.set_handler_limit(key, concurrency); }
  bool can_submit(int key) const override { return engine_.can_submit(key); }
  size_t in_flight() const override { return engine_.in_flight(); }
  size_t in_flight(int key) const override { return engine_.in_flight(key); }
  bool submit(const PipelineHandler& handler, const WebhookMessage& message, int64_t now_ms, std::string* why) override;
  std::vector<HttpResult> take_results() override { return engine_.take_results(); }
  void cancel_all() override { engine_.cancel_all(); }
  // A run of submits shares one signal-blocking section (HttpEngine::Batch).
  void begin_submits() override;
  void end_submits() override { batch_.reset(); }

 private:
  HttpEngine& engine_;
  std::unique_ptr<HttpEngine::Batch> batch_;
};

// Each side's store: it claims (in its own way: the PostgreSQL dispatcher in
// its iteration's transaction, relaybus-mongo from its lanes' window) what
// room() allows and enqueues it; the pipeline calls back here only to end
// deliveries. Both calls may throw; the pipeline then keeps what it can.
class DeliveryStore {
 public:
  virtual ~DeliveryStore() = default;
  // Records each completion as a compare-and-release on its receipt: one
  // whose receipt is no longer the delivery's current one changes nothing.
  virtual void complete(const std::vector<Completion>& batch) = 0;
  // Gives back deliveries that were never sent (expired in the queue, their
  // handler's breaker tripped, the pipeline stopping), on their receipts.
  virtual void release(const std::vector<ClaimedDelivery>& never_sent) = 0;
  // Whether a queued delivery's receipt still holds, checked as it is about to
  // be sent (a MongoDB lane lost meanwhile). Not held: released, not sent.
  // Called between the sink's begin_submits and end_submits: no I/O.
  virtual bool still_held(const ClaimedDelivery&, int64_t /*now_ms*/) { return true; }
};

// Permits of the limits a handler shares with other processes (its
// max_concurrency and rate across a database's dispatchers: has_shared_limit).
// The pipeline asks for one as an attempt is about to go out and gives it back
// with the attempt's result; a handler refused waits, in claim order, while
// the others go on. Calls must not throw.
class HandlerLimiter {
 public:
  virtual ~HandlerLimiter() = default;
  // A permit for one attempt now, or false and *retry_in_ms: when one may be
  // free (a rate's next token; a guess for a concurrency permit another
  // process may give back at any time).
  virtual bool acquire(const PipelineHandler& handler, int64_t now_ms, int64_t* retry_in_ms) = 0;
  virtual void release(const PipelineHandler& handler) = 0;
  // waited deliveries began waiting for a permit in the pump at now_ms (each counted once).
  virtual void held_back(const PipelineHandler& handler, int waited, int64_t now_ms) = 0;
};

struct PipelineOptions {
  int max_in_flight = 256;          // all handlers, in flight + queued
  int complete_batch = 16;          // completions flush at this many...
  int64_t complete_delay_ms = 2;    // ...or once the oldest waited this long, or nothing is in flight
  int64_t complete_retry_ms = 500;  // after a store failure, the batch is tried again this much later
};

class DeliveryPipeline {
 public:
  DeliveryPipeline(DeliverySink& sink, PipelineOptions options, uint64_t seed);

  // How many more deliveries of a handler may be claimed now. Claims run
  // ahead of the handler's concurrency (queued deliveries go out as responses
  // come in: in flight + queued up to 2 x concurrency + 256), and only once
  // half of that is free, so one claim serves many requests; with its breaker
  // open, no more than it may send (0, or 1 for the probe); never beyond
  // max_in_flight for all handlers together.
  // A handler with shared limits claims no more than those let it send soon:
  // 2 x max_concurrency, and a second's worth of rate (at least its burst).
  int room(int key, int concurrency, int64_t now_ms);
  int room(int key, int concurrency, const HandlerOptions& limits, int64_t now_ms);
  // Where handlers with shared limits take their permits; nullptr (the
  // default): their limits are not enforced.
  void set_limiter(HandlerLimiter* limiter) { limiter_ = limiter; }
  // Where each attempt of a traced event becomes a span (span_exporter.hpp);
  // nullptr (the default): none. The host pumps the exporter in its loop.
  void set_span_exporter(SpanExporter* exporter) { span_exporter_ = exporter; }
  // When a delivery held back by its handler's limits may get a permit
  // (pump again then), or -1.
  int64_t next_permit_ms() const { return next_permit_ms_; }
  // Claimed deliveries, in claim order: sent by pump() once there is room,
  // given back instead if still queued after expires_ms.
  void enqueue(const std::shared_ptr<const PipelineHandler>& handler, std::vector<ClaimedDelivery> claimed,
               int64_t expires_ms);
  // Sends queued deliveries that have room now, in claim order; gives back
  // (store.release) those expired, no longer held, or of a handler whose
  // breaker tripped beyond its probe.
  void pump(DeliveryStore& store, int64_t now_ms);
  // Takes the sink's results: breakers, classification. Returns how many
  // completions wait. A result the sink never sent (HttpResult::unsent) is
  // dropped without a completion, as a delivery given back: no attempt was
  // made, the breaker learns nothing, the lane's holder sends it.
  size_t collect(int64_t now_ms);
  // A batch is ready: complete_batch of them, or the oldest waited
  // complete_delay_ms, or nothing is in flight any more (and no store
  // failure asks to wait).
  bool completion_due(int64_t now_ms) const;
  // Hands every waiting completion to store.complete now. If it throws, they
  // wait again (tried after complete_retry_ms; their receipts fence them) and
  // the exception goes on. Returns how many were completed.
  size_t flush(DeliveryStore& store, int64_t now_ms);
  // After a store failure, until complete_retry_ms passed.
  bool flush_paused(int64_t now_ms) const { return now_ms < retry_flush_at_ms_; }
  // Gives back everything queued (the dispatcher stops).
  void release_queued(DeliveryStore& store);
  // Drops what is in flight without results (a drain that timed out).
  void cancel_in_flight();

  // Whether a delivery is queued, in flight or awaiting completion here.
  bool holds(int64_t id) const { return held_.count(id) != 0; }
  // The receipt a delivery in flight was sent under; null if none is.
  const Receipt* receipt_in_flight(int64_t id) const;
  // Results the sink never sent (collect), since the pipeline started.
  uint64_t unsent() const { return unsent_; }
  // Calls f with the receipt of every delivery held here.
  void for_each_receipt(const std::function<void(const Receipt&)>& f) const;
  size_t queued() const { return queue_.size(); }
  size_t in_flight() const { return in_flight_.size(); }
  // A handler's deliveries queued or in flight here (0: the pipeline is idle for it).
  size_t outstanding(int key) const;
  size_t waiting() const { return waiting_.size(); }
  // When an open breaker lets its probe through (the earliest after now_ms), or -1.
  int64_t next_probe_ms(int64_t now_ms) const;
  bool breaker_open(int key) const;

 private:
  struct Queued {
    std::shared_ptr<const PipelineHandler> handler;
    ClaimedDelivery delivery;
    int64_t expires_ms;
    int64_t enqueued_ms;  // monotonic_ms (the hosts' now_ms clocks differ)
    bool waited = false;  // refused a permit once (HandlerLimiter::held_back counted it)
  };
  struct Sent {
    std::shared_ptr<const PipelineHandler> handler;
    Receipt receipt;
    int attempt;
    int64_t published;
    int64_t sent_ms;
    bool permit = false;      // holds a HandlerLimiter permit
    std::string traceparent;  // Completion::traceparent
    std::string parent_span_id;
    int64_t queue_ms = -1;
  };
  void finish(const Sent& sent, const HttpResult& result, int64_t now_ms, bool reached_sink);

  DeliverySink& sink_;
  PipelineOptions options_;
  uint64_t rng_state_;
  std::deque<Queued> queue_;
  std::unordered_map<int, int> queued_of_;  // handler key -> entries in queue_
  std::unordered_map<int64_t, Sent> in_flight_;
  std::vector<Completion> waiting_;
  int64_t first_waiting_ms_ = 0;
  int64_t retry_flush_at_ms_ = 0;
  std::unordered_set<int64_t> held_;
  uint64_t unsent_ = 0;
  std::unordered_map<int, CircuitBreaker> breakers_;
  std::unordered_map<int, int64_t> opened_at_ms_;  // handler key -> when its breaker last (re)opened
  HandlerLimiter* limiter_ = nullptr;
  int64_t next_permit_ms_ = -1;
  SpanExporter* span_exporter_ = nullptr;
};

}  // namespace relaybus::core
