// The delivery pipeline with a real HttpEngine against the loopback test
// server, and an in-memory store (a real implementation of DeliveryStore:
// each delivery has one current receipt; completing or releasing on any
// other receipt changes nothing, as the PostgreSQL leases and the MongoDB
// lane epochs do).

#include "core/delivery_pipeline.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <thread>

#include "core/backoff.hpp"
#include "http_loop.hpp"
#include "span_pump.hpp"
#include "test_http_server.hpp"

namespace relaybus::core {
namespace {

using relaybus::testing::Reply;
using relaybus::testing::TestHttpServer;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class MemoryStore final : public DeliveryStore {
 public:
  struct Row {
    Receipt current;                // the lease's receipt; {0,0}: not leased
    std::string state = "pending";  // pending, delivered, retry, dead
    int64_t retry_in_ms = -1;
    std::string error;
    int status = 0;
    int64_t send_ms = -2;  // Completion::send_ms of the one that took effect
    bool after_gap = false;
  };
  std::map<int64_t, Row> rows;
  std::vector<int64_t> released;
  int completions = 0;  // that took effect
  int stale = 0;        // dropped: receipt not current
  bool fail_next_complete = false;

  ClaimedDelivery claim(int64_t id, const std::string& key = "k", int attempt = 1) {
    Row& r = rows[id];
    r.current = Receipt{static_cast<uint64_t>(id), ++generation_};
    ClaimedDelivery d;
    d.message.id = id;
    d.message.event_id = id;
    d.message.topic = "t";
    d.message.has_key = true;
    d.message.key = key;
    d.message.seq = id;
    d.message.attempt = attempt;
    d.message.payload_json = "{\"n\":" + std::to_string(id) + "}";
    d.receipt = r.current;
    return d;
  }

  void complete(const std::vector<Completion>& batch) override {
    if (fail_next_complete) {
      fail_next_complete = false;
      throw std::runtime_error("store unavailable");
    }
    for (const auto& c : batch) {
      Row& r = rows[c.id];
      if (!(r.current == c.receipt) || c.receipt == Receipt{}) {
        stale++;
        continue;
      }
      r.current = Receipt{};
      r.state = completion_outcome_name(c.outcome);
      r.retry_in_ms = c.retry_in_ms;
      r.error = c.error;
      r.status = c.status;
      r.send_ms = c.send_ms;
      r.after_gap = c.after_gap;
      completions++;
    }
  }
  void release(const std::vector<ClaimedDelivery>& never_sent) override {
    for (const auto& d : never_sent) {
      Row& r = rows[d.message.id];
      if (r.current == d.receipt) r.current = Receipt{};
      released.push_back(d.message.id);
    }
  }

 private:
  uint64_t generation_ = 0;
};

HttpEngineOptions loopback() {
  HttpEngineOptions o;
  std::string why;
  EXPECT_TRUE(parse_allowlist("127.0.0.0/8", &o.allow, &why)) << why;
  return o;
}

std::shared_ptr<const PipelineHandler> handler(const TestHttpServer& server, int concurrency = 4) {
  auto h = std::make_shared<PipelineHandler>();
  h->key = 7;
  h->name = "h";
  h->target = server.url("/hook");
  h->options.concurrency = concurrency;
  h->options.timeout_ms = 5000;
  h->options.backoff_base_ms = 1000;
  h->options.backoff_max_ms = 60000;
  h->options.max_attempts = 3;
  return h;
}

struct Rig {
  explicit Rig(int max_in_flight = 256)
      : engine(loopback()), sink(engine), pipeline(sink, options(max_in_flight), 42) {}
  static PipelineOptions options(int max_in_flight) {
    PipelineOptions o;
    o.max_in_flight = max_in_flight;
    return o;
  }
  // Drives the loop (pump, engine, collect, flush when due) until done() or 10 s.
  bool run_until(const std::function<bool()>& done) {
    const int64_t deadline = now_ms() + 10000;
    while (!done()) {
      if (now_ms() > deadline) return false;
      pipeline.pump(store, now_ms());
      relaybus::testing::http_loop_turn(engine, 5);
      pipeline.collect(now_ms());
      if (pipeline.completion_due(now_ms())) pipeline.flush(store, now_ms());
    }
    return true;
  }
  HttpEngine engine;
  HttpSink sink;
  DeliveryPipeline pipeline;
  MemoryStore store;
};

TEST(DeliveryPipeline, DeliversAndCompletesInBatches) {
  TestHttpServer server([](const auto&) { return Reply{}; });
  Rig rig;
  auto h = handler(server);
  std::vector<ClaimedDelivery> claimed;
  for (int64_t id = 1; id <= 40; id++) claimed.push_back(rig.store.claim(id, "k" + std::to_string(id)));
  rig.pipeline.enqueue(h, std::move(claimed), now_ms() + 60000);
  EXPECT_EQ(rig.pipeline.queued(), 40u);
  EXPECT_TRUE(rig.pipeline.holds(1));
  ASSERT_TRUE(rig.run_until([&] { return rig.store.completions == 40; }));
  for (const auto& [id, row] : rig.store.rows) EXPECT_EQ(row.state, "delivered") << id;
  EXPECT_FALSE(rig.pipeline.holds(1));
  EXPECT_EQ(server.requests().size(), 40u);
  // The request is the shared builder's: the webhook-id is the delivery id.
  EXPECT_FALSE(server.requests()[0].header("webhook-id").empty());
  EXPECT_LE(server.max_concurrent_requests(), 4);
}

TEST(DeliveryPipeline, KeepsClaimOrderWithinAHandler) {
  TestHttpServer server([](const auto&) { return Reply{}; });
  Rig rig;
  auto h = handler(server, 1);
  std::vector<ClaimedDelivery> claimed;
  for (int64_t id = 1; id <= 6; id++) claimed.push_back(rig.store.claim(id, "same"));
  rig.pipeline.enqueue(h, std::move(claimed), now_ms() + 60000);
  ASSERT_TRUE(rig.run_until([&] { return rig.store.completions == 6; }));
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 6u);
  for (size_t i = 0; i < reqs.size(); i++) EXPECT_EQ(reqs[i].header("webhook-id"), std::to_string(i + 1));
  EXPECT_EQ(server.max_concurrent_requests(), 1);
}

TEST(DeliveryPipeline, RoomRunsAheadOfConcurrencyWithinTheGlobalCap) {
  TestHttpServer server([](const auto&) { return Reply{}; });
  Rig rig(300);
  auto h = handler(server, 2);
  const int64_t now = now_ms();
  EXPECT_EQ(rig.pipeline.room(h->key, 2, now), 2 * 2 + 256);
  std::vector<ClaimedDelivery> claimed;
  for (int64_t id = 1; id <= 200; id++) claimed.push_back(rig.store.claim(id, "k" + std::to_string(id)));
  rig.pipeline.enqueue(h, std::move(claimed), now + 60000);
  // 60 left of 260: under half free, no claim for so few.
  EXPECT_EQ(rig.pipeline.room(h->key, 2, now), 0);
  // Another handler is bounded by what all handlers may hold (300 - 200).
  EXPECT_EQ(rig.pipeline.room(8, 16, now), 100);
}

TEST(DeliveryPipeline, OutstandingCountsAHandlersQueuedAndInFlightDeliveriesUntilCompleted) {
  // The receiver holds each request until released, so some stay in flight.
  std::atomic<bool> release{false};
  TestHttpServer server([&](const auto&) {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Reply{};
  });
  Rig rig;
  auto h = handler(server, 2);
  EXPECT_EQ(rig.pipeline.outstanding(h->key), 0u);
  std::vector<ClaimedDelivery> claimed;
  for (int64_t id = 1; id <= 5; id++) claimed.push_back(rig.store.claim(id, "k" + std::to_string(id)));
  rig.pipeline.enqueue(h, std::move(claimed), now_ms() + 60000);
  EXPECT_EQ(rig.pipeline.outstanding(h->key), 5u);  // queued
  EXPECT_EQ(rig.pipeline.outstanding(8), 0u);       // another handler's: none
  rig.pipeline.pump(rig.store, now_ms());
  relaybus::testing::http_loop_turn(rig.engine, 5);
  EXPECT_EQ(rig.pipeline.queued(), 3u);             // 2 went out (concurrency 2)
  EXPECT_EQ(rig.pipeline.outstanding(h->key), 5u);  // 3 queued + 2 in flight
  release = true;
  ASSERT_TRUE(rig.run_until([&] { return rig.store.completions == 5; }));
  EXPECT_EQ(rig.pipeline.outstanding(h->key), 0u);
}

TEST(DeliveryPipeline, ExpiredQueuedDeliveriesAreReleasedNotSent) {
  TestHttpServer server([](const auto&) { return Reply{}; });
  Rig rig;
  auto h = handler(server);
  rig.pipeline.enqueue(h, {rig.store.claim(1), rig.store.claim(2, "k2")}, now_ms() - 1);
  rig.pipeline.pump(rig.store, now_ms());
  EXPECT_EQ(rig.store.released, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(rig.store.rows[1].current, Receipt{});
  EXPECT_EQ(rig.pipeline.queued(), 0u);
  EXPECT_FALSE(rig.pipeline.holds(1));
  EXPECT_EQ(rig.engine.in_flight(), 0u);
  EXPECT_TRUE(server.requests().empty());
}

TEST(DeliveryPipeline, BreakerOpensAndGivesBackTheQueue) {
  TestHttpServer server([](const auto&) { return Reply{503, {}, "down"}; });
  Rig rig;
  auto h = handler(server, 1);
  std::vector<ClaimedDelivery> claimed;
  for (int64_t id = 1; id <= 8; id++) claimed.push_back(rig.store.claim(id, "k" + std::to_string(id)));
  rig.pipeline.enqueue(h, std::move(claimed), now_ms() + 60000);
  ASSERT_TRUE(rig.run_until([&] { return rig.pipeline.breaker_open(h->key) && rig.pipeline.queued() == 0; }));
  // Five failures tripped it; the three still queued went back unsent.
  EXPECT_EQ(server.requests().size(), static_cast<size_t>(CircuitBreaker::kThreshold));
  EXPECT_EQ(rig.store.released, (std::vector<int64_t>{6, 7, 8}));
  EXPECT_EQ(rig.pipeline.room(h->key, 1, now_ms()), 0);
  EXPECT_GT(rig.pipeline.next_probe_ms(now_ms()), now_ms());
  ASSERT_TRUE(rig.run_until([&] { return rig.store.completions == 5; }));
  EXPECT_EQ(rig.store.rows[1].state, "retry");
  EXPECT_EQ(rig.store.rows[1].status, 503);
}

TEST(DeliveryPipeline, ARequestTheSendGateStopsIsNeitherCompletedNorCountedAgainstTheBreaker) {
  TestHttpServer server([](const auto&) { return Reply{}; });
  Rig rig;
  auto h = handler(server);
  // The gate asks the pipeline for the receipt it sent under (as the sidecar
  // does); delivery 1's lease ran out between its submit and its going out.
  std::set<int64_t> lapsed{1};
  rig.engine.set_send_gate([&](uint64_t tag) {
    const Receipt* r = rig.pipeline.receipt_in_flight(static_cast<int64_t>(tag));
    return r != nullptr && lapsed.count(static_cast<int64_t>(tag)) == 0;
  });
  rig.pipeline.enqueue(h, {rig.store.claim(1), rig.store.claim(2, "k2")}, now_ms() + 60000);
  ASSERT_TRUE(rig.run_until([&] { return rig.store.completions == 1 && rig.pipeline.unsent() == 1; }));
  EXPECT_EQ(server.requests().size(), 1u);
  EXPECT_FALSE(rig.pipeline.holds(1));  // claimable again by whoever holds it
  EXPECT_EQ(rig.store.rows[1].state, "pending");
  EXPECT_EQ(rig.store.completions, 1);
  EXPECT_EQ(rig.store.rows[2].state, "delivered");
  EXPECT_FALSE(rig.pipeline.breaker_open(h->key));
  EXPECT_EQ(rig.pipeline.receipt_in_flight(2), nullptr);
}

TEST(DeliveryPipeline, AStaleReceiptsCompletionChangesNothing) {
  TestHttpServer server([](const auto&) { return Reply{}; });
  Rig rig;
  auto h = handler(server);
  rig.pipeline.enqueue(h, {rig.store.claim(1), rig.store.claim(2, "k2")}, now_ms() + 60000);
  rig.pipeline.pump(rig.store, now_ms());
  // Meanwhile delivery 1's lease ran out and another holder claimed it.
  const Receipt other = rig.store.claim(1).receipt;
  ASSERT_TRUE(rig.run_until([&] { return rig.pipeline.waiting() == 0 && rig.pipeline.in_flight() == 0; }));
  EXPECT_EQ(rig.store.stale, 1);
  EXPECT_EQ(rig.store.rows[1].state, "pending");
  EXPECT_EQ(rig.store.rows[1].current, other);
  EXPECT_EQ(rig.store.rows[2].state, "delivered");
}

TEST(DeliveryPipeline, HugeRetryAfterIsClampedToBackoffMax) {
  TestHttpServer server([](const auto& req) {
    // A year, then a value no int64 holds.
    if (req.header("webhook-id") == "1") return Reply{429, {{"Retry-After", "31536000"}}, ""};
    return Reply{429, {{"Retry-After", "99999999999999999999999"}}, ""};
  });
  Rig rig;
  auto h = handler(server);
  rig.pipeline.enqueue(h, {rig.store.claim(1), rig.store.claim(2, "k2")}, now_ms() + 60000);
  ASSERT_TRUE(rig.run_until([&] { return rig.store.completions == 2; }));
  for (int64_t id : {1, 2}) {
    EXPECT_EQ(rig.store.rows[id].state, "retry");
    EXPECT_EQ(rig.store.rows[id].retry_in_ms, h->options.backoff_max_ms) << id;
    EXPECT_EQ(rig.store.rows[id].status, 429);
  }
}

TEST(DeliveryPipeline, ClassifiesEachOutcome) {
  PipelineHandler h;
  h.key = 1;
  h.options.max_attempts = 3;
  h.options.backoff_base_ms = 1000;
  h.options.backoff_max_ms = 60000;
  HttpResult ok;
  ok.tag = 5;
  ok.outcome = HttpOutcome::Success;
  ok.status = 200;
  EXPECT_EQ(classify_result(h, ok, 1, 0).outcome, CompletionOutcome::Delivered);
  EXPECT_EQ(classify_result(h, ok, 1, 0).id, 5);

  HttpResult busy;
  busy.outcome = HttpOutcome::Retry;
  busy.status = 500;
  busy.error = "HTTP 500";
  Completion c = classify_result(h, busy, 2, 123456789);
  EXPECT_EQ(c.outcome, CompletionOutcome::Retry);
  EXPECT_GE(c.retry_in_ms, 0);
  EXPECT_LE(c.retry_in_ms, backoff_ceiling_ms(h.options.backoff(), 2));
  EXPECT_EQ(c.error, "HTTP 500");
  // The last attempt goes to dead letters.
  EXPECT_EQ(classify_result(h, busy, 3, 0).outcome, CompletionOutcome::Dead);
  // Retry-After is used as given when it is within backoff_max.
  busy.retry_after_ms = 2500;
  EXPECT_EQ(classify_result(h, busy, 1, 0).retry_in_ms, 2500);

  HttpResult bad;
  bad.outcome = HttpOutcome::Fail;
  bad.status = 400;
  EXPECT_EQ(classify_result(h, bad, 1, 0).outcome, CompletionOutcome::Dead);
  h.options.retry_4xx = true;
  EXPECT_EQ(classify_result(h, bad, 1, 0).outcome, CompletionOutcome::Retry);
  // A refused address is permanent even with retry_4xx.
  HttpResult refused;
  refused.outcome = HttpOutcome::Fail;
  EXPECT_EQ(classify_result(h, refused, 1, 0).outcome, CompletionOutcome::Dead);
}

TEST(DeliveryPipeline, AStoreFailureKeepsTheBatchForLater) {
  TestHttpServer server([](const auto&) { return Reply{}; });
  Rig rig;
  auto h = handler(server);
  rig.pipeline.enqueue(h, {rig.store.claim(1)}, now_ms() + 60000);
  rig.pipeline.pump(rig.store, now_ms());
  const int64_t deadline = now_ms() + 10000;
  while (rig.pipeline.collect(now_ms()) == 0 && now_ms() < deadline) relaybus::testing::http_loop_turn(rig.engine, 5);
  ASSERT_EQ(rig.pipeline.waiting(), 1u);
  rig.store.fail_next_complete = true;
  const int64_t t = now_ms();
  EXPECT_THROW(rig.pipeline.flush(rig.store, t), std::runtime_error);
  EXPECT_EQ(rig.pipeline.waiting(), 1u);
  EXPECT_TRUE(rig.pipeline.holds(1));
  EXPECT_FALSE(rig.pipeline.completion_due(t + 1));
  EXPECT_TRUE(rig.pipeline.completion_due(t + 500));
  EXPECT_EQ(rig.pipeline.flush(rig.store, t + 500), 1u);
  EXPECT_EQ(rig.store.rows[1].state, "delivered");
}

TEST(DeliveryPipeline, ReleaseQueuedAndReceiptsSeen) {
  TestHttpServer server([](const auto&) { return Reply{}; });
  Rig rig;
  auto h = handler(server);
  rig.pipeline.enqueue(h, {rig.store.claim(1), rig.store.claim(2, "k2")}, now_ms() + 60000);
  int seen = 0;
  rig.pipeline.for_each_receipt([&](const Receipt&) { seen++; });
  EXPECT_EQ(seen, 2);
  rig.pipeline.release_queued(rig.store);
  EXPECT_EQ(rig.store.released.size(), 2u);
  EXPECT_FALSE(rig.pipeline.holds(2));
  EXPECT_EQ(rig.pipeline.room(h->key, 4, now_ms()), 256);  // 2 x 4 + 256, cut to max_in_flight
}

}  // namespace
}  // namespace relaybus::core

namespace relaybus::core {
namespace {

// A sink whose requests end when the test says (a real DeliverySink, no
// network): for timings the loopback server cannot pin down.
class ScriptedSink final : public DeliverySink {
 public:
  std::vector<int64_t> sent;
  std::vector<TraceContext> traces;  // per submit: the attempt's trace context
  std::vector<HttpResult> ready;
  std::map<int64_t, bool> open;
  bool refuse = false;  // submit() refuses (as a bad URL would be)
  void set_handler_limit(int, int) override {}
  bool can_submit(int) const override { return true; }
  size_t in_flight() const override { return open.size(); }
  size_t in_flight(int) const override { return open.size(); }
  bool submit(const PipelineHandler&, const WebhookMessage& m, int64_t, std::string* why) override {
    if (refuse) {
      *why = "refused";
      return false;
    }
    sent.push_back(m.id);
    traces.push_back(m.trace);
    open[m.id] = true;
    return true;
  }
  std::vector<HttpResult> take_results() override {
    std::vector<HttpResult> out;
    out.swap(ready);
    return out;
  }
  void cancel_all() override { open.clear(); }
  void fail(int64_t id) {
    HttpResult r;
    r.tag = static_cast<uint64_t>(id);
    r.outcome = HttpOutcome::Retry;
    r.status = 503;
    r.error = "HTTP 503";
    open.erase(id);
    ready.push_back(r);
  }
  void succeed(int64_t id, bool after_gap = false) {
    HttpResult r;
    r.tag = static_cast<uint64_t>(id);
    r.outcome = HttpOutcome::Success;
    r.after_gap = after_gap;
    open.erase(id);
    ready.push_back(r);
  }
};

std::shared_ptr<PipelineHandler> scripted_handler(int key) {
  auto h = std::make_shared<PipelineHandler>();
  h->key = key;
  h->options.concurrency = 16;
  h->options.max_attempts = 3;
  return h;
}

// The send time is the pipeline's: from the pump that handed the attempt to
// the sink to the collect that took its result, whatever the sink; an
// attempt the sink refused never went out and has none.
TEST(DeliveryPipeline, CompletionsCarryTheirSendTime) {
  ScriptedSink sink;
  DeliveryPipeline pipeline(sink, PipelineOptions{}, 1);
  MemoryStore store;
  auto h = scripted_handler(4);
  const int64_t t0 = 5000000;
  pipeline.enqueue(h, {store.claim(1), store.claim(2, "k2")}, t0 + 60000);
  pipeline.pump(store, t0);
  ASSERT_EQ(sink.sent.size(), 2u);
  sink.succeed(1);
  pipeline.collect(t0 + 37);
  sink.succeed(2, true);
  pipeline.collect(t0 + 250);
  pipeline.flush(store, t0 + 250);
  EXPECT_EQ(store.rows[1].send_ms, 37);
  EXPECT_FALSE(store.rows[1].after_gap);
  EXPECT_EQ(store.rows[2].send_ms, 250);
  EXPECT_TRUE(store.rows[2].after_gap) << "a sink's after_gap reaches the store";
  sink.refuse = true;
  pipeline.enqueue(h, {store.claim(3, "k3")}, t0 + 60000);
  pipeline.pump(store, t0 + 300);
  pipeline.flush(store, t0 + 300);
  EXPECT_EQ(store.rows[3].state, "dead") << "a request the sink refuses is a failure for good";
  EXPECT_EQ(store.rows[3].send_ms, -1) << "refused by the sink: never sent";
}

// Every attempt of an event with a trace context goes out as a new span of
// the publisher's trace (same trace-id and flags, the stored tracestate), and
// its Completion names that span and its parent; an event without one has none.
TEST(DeliveryPipeline, EachAttemptIsANewSpanOfThePublishersTrace) {
  ScriptedSink sink;
  DeliveryPipeline pipeline(sink, PipelineOptions{}, 1);
  MemoryStore store;
  auto h = scripted_handler(5);
  const std::string tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  ClaimedDelivery d1 = store.claim(1);
  d1.message.headers_json = R"({"traceparent":")" + tp + R"(","tracestate":"congo=t61rcWkgMzE","x":"y"})";
  const int64_t t0 = 5000000;
  pipeline.enqueue(h, {d1, store.claim(2, "k2")}, t0 + 60000);
  pipeline.pump(store, t0);
  ASSERT_EQ(sink.traces.size(), 2u);
  const TraceContext first = sink.traces[0];
  ASSERT_TRUE(first.present());
  EXPECT_TRUE(valid_traceparent(first.traceparent));
  EXPECT_EQ(first.traceparent.substr(0, 36), tp.substr(0, 36));
  EXPECT_EQ(first.traceparent.substr(52), tp.substr(52));
  EXPECT_NE(first.traceparent.substr(36, 16), tp.substr(36, 16));
  EXPECT_EQ(first.tracestate, "congo=t61rcWkgMzE");
  EXPECT_FALSE(sink.traces[1].present()) << "no trace context stored, none sent";
  sink.fail(1);
  sink.succeed(2);
  pipeline.collect(t0 + 10);
  std::vector<Completion> seen;
  struct Capture final : DeliveryStore {
    std::vector<Completion>* out;
    void complete(const std::vector<Completion>& b) override { out->insert(out->end(), b.begin(), b.end()); }
    void release(const std::vector<ClaimedDelivery>&) override {}
  } capture;
  capture.out = &seen;
  pipeline.flush(capture, t0 + 10);
  ASSERT_EQ(seen.size(), 2u);
  for (const Completion& c : seen) {
    if (c.id == 1) {
      EXPECT_EQ(c.traceparent, first.traceparent) << "the Completion names the attempt's span";
      EXPECT_EQ(c.parent_span_id, "00f067aa0ba902b7");
    } else {
      EXPECT_TRUE(c.traceparent.empty());
      EXPECT_TRUE(c.parent_span_id.empty());
    }
  }
  ClaimedDelivery again = store.claim(1, "k", 2);
  again.message.headers_json = d1.message.headers_json;
  pipeline.enqueue(h, {again}, t0 + 60000);
  pipeline.pump(store, t0 + 20);
  ASSERT_EQ(sink.traces.size(), 3u);
  EXPECT_EQ(sink.traces[2].traceparent.substr(0, 36), tp.substr(0, 36));
  EXPECT_NE(sink.traces[2].traceparent, first.traceparent) << "the retry is a span of its own";
}

// With a span exporter, each attempt of a traced event becomes a span: the
// attempt's own span id (what the sink sent), the publisher's as its parent;
// an untraced event makes none.
TEST(DeliveryPipeline, EachTracedAttemptBecomesASpan) {
  TestHttpServer collector([](const testing::RecordedRequest&) { return Reply{200, {}, "{}"}; });
  SpanExporterOptions eo;
  eo.endpoint = collector.url("/");
  eo.batch_delay_ms = 0;
  SpanExporter exporter(eo);
  ScriptedSink sink;
  DeliveryPipeline pipeline(sink, PipelineOptions{}, 1);
  pipeline.set_span_exporter(&exporter);
  MemoryStore store;
  auto h = scripted_handler(5);
  h->name = "orders-webhook";
  const std::string tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  ClaimedDelivery d1 = store.claim(1);
  d1.message.headers_json = R"({"traceparent":")" + tp + R"("})";
  const int64_t t0 = testing::steady_ms();  // the exporter's clock too
  pipeline.enqueue(h, {d1, store.claim(2, "k2")}, t0 + 60000);
  pipeline.pump(store, t0);
  ASSERT_EQ(sink.traces.size(), 2u);
  sink.fail(1);
  sink.succeed(2);
  pipeline.collect(t0 + 10);
  EXPECT_EQ(exporter.queued(), 1u) << "the untraced delivery makes no span";
  testing::pump_until(
      exporter, [&] { return exporter.exported() >= 1; }, 20000);
  ASSERT_EQ(exporter.exported(), 1u);
  auto reqs = collector.requests();
  ASSERT_EQ(reqs.size(), 1u);
  auto body = nlohmann::json::parse(reqs[0].body);
  const auto& sp = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(sp["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(sp["parentSpanId"], "00f067aa0ba902b7");
  EXPECT_EQ(sp["spanId"], sink.traces[0].traceparent.substr(36, 16)) << "the span the attempt sent";
  EXPECT_EQ(sp["name"], "deliver orders-webhook");
  EXPECT_EQ(sp["status"]["code"], 2);
}

TEST(DeliveryPipeline, LateFailuresOfRequestsSentBeforeTheBreakerOpenedDoNotGrowIt) {
  ScriptedSink sink;
  DeliveryPipeline pipeline(sink, PipelineOptions{}, 1);
  MemoryStore store;
  auto h = std::make_shared<PipelineHandler>();
  h->key = 3;
  h->options.concurrency = 16;
  h->options.backoff_base_ms = 200;
  h->options.backoff_max_ms = 60000;
  h->options.max_attempts = 1000;
  std::vector<ClaimedDelivery> claimed;
  for (int64_t id = 1; id <= 16; id++) claimed.push_back(store.claim(id, "k" + std::to_string(id)));
  const int64_t t0 = 1000000;
  pipeline.enqueue(h, std::move(claimed), t0 + 60000);
  pipeline.pump(store, t0);
  ASSERT_EQ(sink.sent.size(), 16u);
  for (int64_t id = 1; id <= 5; id++) sink.fail(id);
  pipeline.collect(t0 + 10);
  ASSERT_TRUE(pipeline.breaker_open(h->key));
  EXPECT_EQ(pipeline.next_probe_ms(t0 + 10), t0 + 10 + 200);
  // The other 11 come back one by one, long after the open period ended.
  for (int64_t id = 6; id <= 16; id++) {
    sink.fail(id);
    pipeline.collect(t0 + 1000 + id * 300);
  }
  EXPECT_EQ(pipeline.next_probe_ms(t0), t0 + 10 + 200) << "only a probe's failure grows the backoff";
  // A probe sent now that fails doubles it.
  store.rows.clear();
  pipeline.enqueue(h, {store.claim(100)}, t0 + 60000);
  pipeline.pump(store, t0 + 10000);
  ASSERT_EQ(sink.sent.back(), 100);
  sink.fail(100);
  pipeline.collect(t0 + 10010);
  EXPECT_EQ(pipeline.next_probe_ms(t0 + 10010), t0 + 10010 + 400);
}

// A limiter of one process, as the dispatchers' shared-memory one behaves for
// a single dispatcher: max_concurrency permits, no rate.
class CountingLimiter final : public HandlerLimiter {
 public:
  std::map<int, int> in_flight;
  std::map<int, int> waited;
  bool acquire(const PipelineHandler& h, int64_t, int64_t* retry_in_ms) override {
    if (in_flight[h.key] >= h.options.max_concurrency) {
      *retry_in_ms = 10;
      return false;
    }
    in_flight[h.key]++;
    return true;
  }
  void release(const PipelineHandler& h) override { in_flight[h.key]--; }
  void held_back(const PipelineHandler& h, int n, int64_t) override { waited[h.key] += n; }
};

// A handler held back by its shared limit waits in claim order, counted once
// per delivery, and the next handler's deliveries go out past it.
TEST(DeliveryPipeline, ALimitedHandlerWaitsInOrderWithoutHoldingOthersBack) {
  ScriptedSink sink;
  CountingLimiter limiter;
  MemoryStore store;
  DeliveryPipeline pipeline(sink, PipelineOptions{}, 1);
  pipeline.set_limiter(&limiter);
  auto limited = std::make_shared<PipelineHandler>();
  limited->key = 1;
  limited->options.max_concurrency = 2;
  auto free = std::make_shared<PipelineHandler>();
  free->key = 2;
  const int64_t t0 = 1000000;
  EXPECT_EQ(pipeline.room(1, 16, limited->options, t0), 4);  // 2 x max_concurrency
  std::vector<ClaimedDelivery> a, b;
  for (int64_t id = 1; id <= 4; id++) a.push_back(store.claim(id, "same"));
  for (int64_t id = 11; id <= 13; id++) b.push_back(store.claim(id));
  pipeline.enqueue(limited, std::move(a), t0 + 60000);
  pipeline.enqueue(free, std::move(b), t0 + 60000);
  pipeline.pump(store, t0);
  EXPECT_EQ(sink.sent, (std::vector<int64_t>{1, 2, 11, 12, 13}));
  EXPECT_EQ(limiter.waited[1], 2);
  EXPECT_EQ(pipeline.next_permit_ms(), t0 + 10);
  EXPECT_EQ(pipeline.room(1, 16, limited->options, t0), 0);  // 4 held of 4
  pipeline.pump(store, t0 + 10);
  EXPECT_EQ(limiter.waited[1], 2);  // still the same two waiting: not counted again
  sink.succeed(1);
  pipeline.collect(t0 + 20);
  EXPECT_EQ(limiter.in_flight[1], 1);
  pipeline.pump(store, t0 + 20);
  EXPECT_EQ(sink.sent, (std::vector<int64_t>{1, 2, 11, 12, 13, 3}));
  pipeline.cancel_in_flight();
  EXPECT_EQ(limiter.in_flight[1], 0);  // permits come back with cancelled attempts
}

}  // namespace
}  // namespace relaybus::core
