// The span exporter against the loopback test server standing in for a
// collector's OTLP/HTTP receiver (test/integration/otlp_spans.sh sends to a
// real OpenTelemetry Collector): what the request holds, batching by size and
// time, one request in flight, and dropping without blocking when the
// collector refuses, is down or hangs.

#include "core/span_exporter.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/delivery_pipeline.hpp"
#include "span_pump.hpp"
#include "test_http_server.hpp"

namespace relaybus::core {
namespace {

using nlohmann::json;
using relaybus::testing::pump_until;
using relaybus::testing::Reply;
using relaybus::testing::steady_ms;
using relaybus::testing::TestHttpServer;

SpanRecord span(int attempt, int status, bool failed) {
  SpanRecord s;
  s.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  s.span_id = "a0b1c2d3e4f50617";
  s.parent_span_id = "00f067aa0ba902b7";
  s.handler = "orders-webhook";
  s.delivery_id = 42;
  s.attempt = attempt;
  s.outcome = failed ? "retry" : "delivered";
  s.failed = failed;
  s.error = failed ? "HTTP " + std::to_string(status) : "";
  s.queue_ms = 3;
  s.send_ms = 7;
  s.start_unix_nano = 1700000000000000000;
  s.end_unix_nano = 1700000000007000000;
  s.http_status = status;
  return s;
}

// The attribute's value object, or null.
json attr(const json& attrs, const std::string& key) {
  for (const auto& a : attrs)
    if (a["key"] == key) return a["value"];
  return json();
}

TEST(SpanExporter, TracesUrlAndHeaders) {
  std::string url, why;
  ASSERT_TRUE(otlp_traces_url("http://127.0.0.1:4318", &url, &why));
  EXPECT_EQ(url, "http://127.0.0.1:4318/v1/traces");
  ASSERT_TRUE(otlp_traces_url("https://otel.example:4318/", &url, &why));
  EXPECT_EQ(url, "https://otel.example:4318/v1/traces");
  ASSERT_TRUE(otlp_traces_url("http://c:4318/custom/v1/traces", &url, &why));
  EXPECT_EQ(url, "http://c:4318/custom/v1/traces");
  EXPECT_FALSE(otlp_traces_url("127.0.0.1:4318", &url, &why));
  EXPECT_NE(why.find("http://"), std::string::npos);
  EXPECT_FALSE(otlp_traces_url("http://", &url, &why));
  EXPECT_FALSE(otlp_traces_url("http://a b:1", &url, &why));

  std::vector<std::pair<std::string, std::string>> h;
  ASSERT_TRUE(parse_otlp_headers(" api-key = secret ,x-tenant=t1,", &h, &why));
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], std::make_pair(std::string("api-key"), std::string("secret")));
  EXPECT_EQ(h[1], std::make_pair(std::string("x-tenant"), std::string("t1")));
  ASSERT_TRUE(parse_otlp_headers("", &h, &why));
  EXPECT_TRUE(h.empty());
  EXPECT_FALSE(parse_otlp_headers("novalue", &h, &why));
  EXPECT_FALSE(parse_otlp_headers("bad name=1", &h, &why));
}

TEST(SpanExporter, SpanJsonFollowsOtlpAndTheConventions) {
  json http = json::parse(otlp_span_json(span(1, 500, true)));
  EXPECT_EQ(http["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(http["spanId"], "a0b1c2d3e4f50617");
  EXPECT_EQ(http["parentSpanId"], "00f067aa0ba902b7");
  EXPECT_EQ(http["kind"], 3) << "CLIENT";
  EXPECT_EQ(http["startTimeUnixNano"], "1700000000000000000") << "64-bit integers as decimal strings";
  EXPECT_EQ(http["endTimeUnixNano"], "1700000000007000000");
  EXPECT_EQ(http["status"]["code"], 2) << "ERROR";
  EXPECT_EQ(http["status"]["message"], "HTTP 500");
  const json& a = http["attributes"];
  EXPECT_EQ(attr(a, "http.response.status_code")["intValue"], "500");
  EXPECT_EQ(attr(a, "relaybus.handler")["stringValue"], "orders-webhook");
  EXPECT_EQ(attr(a, "relaybus.attempt")["intValue"], "1");
  EXPECT_EQ(attr(a, "relaybus.outcome")["stringValue"], "retry");
  EXPECT_EQ(attr(a, "relaybus.queue_wait_ms")["intValue"], "3");
  EXPECT_EQ(attr(a, "relaybus.send_ms")["intValue"], "7");
  EXPECT_EQ(attr(a, "error.type")["stringValue"], "500");

  json ok = json::parse(otlp_span_json(span(2, 200, false)));
  EXPECT_FALSE(ok.contains("status")) << "success leaves the status unset";
  EXPECT_TRUE(attr(ok["attributes"], "error.type").is_null());

  SpanRecord odd = span(1, 0, true);
  odd.handler = "h\"1";
  odd.error = "refused: \"x\"\n\xff";
  json escaped = json::parse(otlp_span_json(odd));
  EXPECT_EQ(escaped["name"], "deliver h\"1") << "quotes escaped";
  EXPECT_EQ(escaped["status"]["message"], "refused: \"x\"\n\xef\xbf\xbd") << "invalid UTF-8 replaced";
  json batch = json::parse(otlp_traces_json({otlp_span_json(odd), otlp_span_json(span(2, 200, false))}, "agent"));
  EXPECT_EQ(batch["resourceSpans"][0]["scopeSpans"][0]["spans"].size(), 2u);

  SpanRecord k = span(1, 0, false);
  k.kind = HandlerKind::Kafka;
  k.destination = "orders";
  k.kafka_partition = 2;
  k.kafka_offset = 17;
  json kafka = json::parse(otlp_span_json(k));
  EXPECT_EQ(kafka["kind"], 4) << "PRODUCER";
  EXPECT_EQ(attr(kafka["attributes"], "messaging.system")["stringValue"], "kafka");
  EXPECT_EQ(attr(kafka["attributes"], "messaging.destination.name")["stringValue"], "orders");
  EXPECT_EQ(attr(kafka["attributes"], "messaging.destination.partition.id")["stringValue"], "2");
  EXPECT_EQ(attr(kafka["attributes"], "messaging.kafka.offset")["intValue"], "17");
  EXPECT_TRUE(attr(kafka["attributes"], "http.response.status_code").is_null());
}

TEST(SpanExporter, PostsBatchesToTheTracesPath) {
  TestHttpServer server([](const testing::RecordedRequest&) { return Reply{200, {}, "{}"}; });
  SpanExporterOptions o;
  o.endpoint = server.url("/");
  o.headers = {{"x-api-key", "k1"}};
  o.edition = "extension";
  o.max_batch = 2;
  o.batch_delay_ms = 50;
  SpanExporter e(o);
  for (int i = 1; i <= 5; i++) ASSERT_TRUE(e.add(span(i, 200, false), steady_ms()));
  EXPECT_EQ(e.wake_in_ms(steady_ms()), 0) << "a full batch is due at once";
  pump_until(
      e, [&] { return e.exported() == 5; }, 20000);
  EXPECT_EQ(e.exported(), 5u);
  EXPECT_EQ(e.dropped(), 0u);
  EXPECT_EQ(e.failed(), 0u);
  EXPECT_EQ(e.wake_in_ms(steady_ms()), -1);
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 3u) << "2 + 2 + 1: the last one after the batch delay";
  EXPECT_EQ(server.max_concurrent_requests(), 1) << "one request in flight";
  size_t spans = 0;
  for (const auto& r : reqs) {
    EXPECT_EQ(r.method, "POST");
    EXPECT_EQ(r.target, "/v1/traces");
    EXPECT_EQ(r.header("content-type"), "application/json");
    EXPECT_EQ(r.header("x-api-key"), "k1");
    json body = json::parse(r.body);
    const json& rs = body["resourceSpans"][0];
    EXPECT_EQ(attr(rs["resource"]["attributes"], "service.name")["stringValue"], "relaybus");
    EXPECT_EQ(attr(rs["resource"]["attributes"], "relaybus.edition")["stringValue"], "extension");
    EXPECT_EQ(rs["scopeSpans"][0]["scope"]["name"], "relaybus");
    spans += rs["scopeSpans"][0]["spans"].size();
  }
  EXPECT_EQ(spans, 5u);
}

TEST(SpanExporter, ARefusingCollectorDropsAndCounts) {
  TestHttpServer server([](const testing::RecordedRequest&) { return Reply{503, {}, "busy"}; });
  SpanExporterOptions o;
  o.endpoint = server.url("/");
  o.batch_delay_ms = 0;
  SpanExporter e(o);
  e.add(span(1, 200, false), steady_ms());
  e.add(span(2, 200, false), steady_ms());
  pump_until(
      e, [&] { return e.failed() == 1; }, 20000);
  EXPECT_EQ(e.failed(), 1u);
  EXPECT_EQ(e.dropped(), 2u) << "not retried: a retry would pile up behind a struggling collector";
  EXPECT_EQ(e.exported(), 0u);
  EXPECT_EQ(e.take_error(steady_ms()), "HTTP 503");
  EXPECT_EQ(e.take_error(steady_ms()), "") << "once a minute at most";
}

TEST(SpanExporter, ADownCollectorNeverBlocks) {
  // A port nothing listens on: bound, then closed.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
  socklen_t len = sizeof sin;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len);
  close(fd);
  SpanExporterOptions o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(ntohs(sin.sin_port));
  o.batch_delay_ms = 0;
  SpanExporter e(o);
  for (int i = 0; i < 3; i++) e.add(span(i, 200, false), steady_ms());
  const int64_t longest = pump_until(
      e, [&] { return e.failed() >= 1; }, 20000);
  EXPECT_EQ(e.failed(), 1u);
  EXPECT_EQ(e.dropped(), 3u);
  EXPECT_LT(longest, 200) << "a pump never waits for the network";
}

TEST(SpanExporter, AHangingCollectorTimesOutAndAFullQueueDrops) {
  TestHttpServer server([](const testing::RecordedRequest&) {
    Reply r{200, {}, "{}"};
    r.delay_ms = 5000;
    return r;
  });
  SpanExporterOptions o;
  o.endpoint = server.url("/");
  o.batch_delay_ms = 0;
  o.max_queue = 4;
  o.timeout_ms = 300;
  SpanExporter e(o);
  e.add(span(1, 200, false), steady_ms());
  e.pump(steady_ms());
  ASSERT_TRUE(e.in_flight());
  EXPECT_GE(e.wake_in_ms(steady_ms()), 0);
  EXPECT_LE(e.wake_in_ms(steady_ms()), SpanExporter::kPollMs) << "a request in flight is polled";
  int accepted = 0;
  for (int i = 0; i < 10; i++) accepted += e.add(span(i, 200, false), steady_ms()) ? 1 : 0;
  EXPECT_EQ(accepted, 4) << "a bounded queue";
  EXPECT_EQ(e.dropped(), 6u);
  const int64_t t0 = steady_ms();
  const int64_t longest = pump_until(
      e, [&] { return e.failed() >= 1; }, 20000);
  EXPECT_EQ(e.failed(), 1u);
  EXPECT_LT(steady_ms() - t0, 4000) << "the request's timeout ended it, not the reply";
  EXPECT_LT(longest, 200);
  EXPECT_EQ(e.dropped(), 7u) << "the timed-out request's span";
  EXPECT_TRUE(e.in_flight() || e.queued() == 4u) << "the queued spans go next";
}

TEST(SpanExporter, SpanOfACompletion) {
  Completion c;
  c.id = 9;
  c.handler = "h";
  c.outcome = CompletionOutcome::Dead;
  c.error = "HTTP 410";
  c.status = 410;
  c.attempt = 3;
  c.send_ms = 12;
  c.queue_ms = 4;
  PipelineHandler h;
  h.kind = HandlerKind::Kafka;
  h.target = "kafka://127.0.0.1:9092/orders";
  SpanRecord s;
  EXPECT_FALSE(span_of_completion(c, h, &s)) << "no trace context, no span";
  c.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-a0b1c2d3e4f50617-01";
  c.parent_span_id = "00f067aa0ba902b7";
  ASSERT_TRUE(span_of_completion(c, h, &s));
  EXPECT_EQ(s.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(s.span_id, "a0b1c2d3e4f50617");
  EXPECT_EQ(s.parent_span_id, "00f067aa0ba902b7");
  EXPECT_EQ(s.outcome, "dead");
  EXPECT_TRUE(s.failed);
  EXPECT_EQ(s.attempt, 3);
  EXPECT_EQ(s.destination, "orders");
  EXPECT_EQ(s.end_unix_nano - s.start_unix_nano, 12000000);
}

TEST(SpanExporter, SpanOfANotify) {
  NotifyAttempt a;
  a.sent_traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-a0b1c2d3e4f50617-01";
  a.stored_traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  a.handler = "n";
  a.channel = "orders_events";
  a.delivery_id = 7;
  a.attempt = 1;
  a.claim_unix_nano = 1000000000;
  a.sent_unix_nano = 1003000000;
  SpanRecord s;
  ASSERT_TRUE(span_of_notify(a, &s));
  EXPECT_EQ(s.span_id, "a0b1c2d3e4f50617");
  EXPECT_EQ(s.parent_span_id, "00f067aa0ba902b7");
  EXPECT_EQ(s.outcome, "delivered");
  EXPECT_FALSE(s.failed);
  EXPECT_EQ(s.queue_ms, 3);
  EXPECT_EQ(s.end_unix_nano - s.start_unix_nano, 3000000);
  const std::string json = otlp_span_json(s);
  EXPECT_NE(json.find("\"kind\":4"), std::string::npos) << json;
  EXPECT_NE(json.find("{\"key\":\"messaging.destination.name\",\"value\":{\"stringValue\":\"orders_events\"}}"),
            std::string::npos)
      << json;
  EXPECT_EQ(json.find("http.request.method"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"status\""), std::string::npos) << json;

  a.handed_over = true;
  ASSERT_TRUE(span_of_notify(a, &s));
  EXPECT_EQ(s.outcome, "notified");
  a.stored_traceparent = "00-short";
  EXPECT_FALSE(span_of_notify(a, &s)) << "no parent to join: no span";
}

}  // namespace
}  // namespace relaybus::core
