#include "core/webhook_delivery.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/webhook_signature.hpp"
#include "request_header.hpp"

using namespace relaybus::core;

TEST(WebhookDelivery, RequestCarriesStandardWebhookHeadersAndHandlerHeaders) {
  HandlerOptions o;
  std::string why;
  ASSERT_TRUE(parse_handler_options(HandlerKind::Http,
                                    R"({"secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw","timeout":"5s",)"
                                    R"("headers":{"authorization":"Bearer x"},"follow_redirects":true})",
                                    &o, &why))
      << why;
  HttpRequest r = make_webhook_request(o, "http://127.0.0.1:1/h", 7, 42, "{\"a\":1}", 1700000000);
  EXPECT_EQ(r.tag, 42u);
  EXPECT_EQ(r.handler_key, 7);
  EXPECT_EQ(r.url, "http://127.0.0.1:1/h");
  EXPECT_EQ(r.timeout_ms, 5000);
  EXPECT_TRUE(r.follow_redirects);
  EXPECT_EQ(header(r, "webhook-id"), "42");
  EXPECT_EQ(header(r, "webhook-timestamp"), "1700000000");
  EXPECT_EQ(header(r, "webhook-signature"), webhook_signature(o.secrets, "42", 1700000000, "{\"a\":1}"));
  EXPECT_EQ(header(r, "authorization"), "Bearer x");
  EXPECT_EQ(r.max_retry_after_ms, o.backoff_max_ms);  // Retry-After is cut to backoff_max
  HandlerOptions plain;
  EXPECT_EQ(header(make_webhook_request(plain, "http://x/", 1, 1, "{}", 1), "webhook-signature"), "<none>");
}

// The PostgreSQL dispatchers and relaybus-mongo both build their requests
// with build_webhook_request: the same delivery at the same timestamp gives the
// same bytes (body and every header); only the timestamp and the signature
// over it change with the time of sending.
TEST(WebhookDelivery, OneBuilderGivesTheSameBytesForTheSameDeliveryAndTimestamp) {
  HandlerOptions o;
  std::string why;
  ASSERT_TRUE(parse_handler_options(HandlerKind::Http,
                                    R"({"secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",)"
                                    R"("headers":{"x-team":"billing"},"backoff_max":"2min"})",
                                    &o, &why))
      << why;
  WebhookMessage m;
  m.id = 42;
  m.event_id = 7;
  m.topic = "order.created";
  m.has_key = true;
  m.key = "order-42";
  m.seq = 3;
  m.attempt = 2;
  m.headers_json = R"({"trace": "t-1"})";
  m.payload_json = R"({"a": 1, "b": "\u20ac"})";
  m.published_at_ms = 1700000000000;
  const HttpRequest a = build_webhook_request(o, "https://hooks.example/x", 5, m, 1700000000);
  const HttpRequest b = build_webhook_request(o, "https://hooks.example/x", 5, WebhookMessage(m), 1700000000);
  EXPECT_EQ(a.body, R"({"id":42,"event_id":7,"topic":"order.created","key":"order-42","seq":3,)"
                    R"("published_at":"2023-11-14T22:13:20.000Z","attempt":2,)"
                    R"("headers":{"trace": "t-1"},"payload":{"a": 1, "b": "\u20ac"}})");
  EXPECT_EQ(a.body, b.body);
  EXPECT_EQ(a.headers, b.headers);
  EXPECT_EQ(a.url, b.url);
  EXPECT_EQ(a.tag, 42u);
  EXPECT_EQ(a.handler_key, 5);
  EXPECT_EQ(a.max_retry_after_ms, 120000);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"webhook-id", "42"},
      {"webhook-timestamp", "1700000000"},
      {"webhook-signature", webhook_signature(o.secrets, "42", 1700000000, a.body)},
      {"x-team", "billing"}};
  EXPECT_EQ(a.headers, want);

  // Sent a minute later (after waiting in a queue, or as a retry): same body,
  // a new timestamp and a signature over it.
  const HttpRequest later = build_webhook_request(o, "https://hooks.example/x", 5, m, 1700000060);
  EXPECT_EQ(later.body, a.body);
  EXPECT_EQ(header(later, "webhook-timestamp"), "1700000060");
  EXPECT_EQ(header(later, "webhook-signature"), webhook_signature(o.secrets, "42", 1700000060, a.body));
  EXPECT_NE(header(later, "webhook-signature"), header(a, "webhook-signature"));

  // Unkeyed: key and seq are null; "envelope": false sends the payload text alone.
  WebhookMessage unkeyed = m;
  unkeyed.has_key = false;
  unkeyed.headers_json.clear();
  EXPECT_EQ(build_webhook_request(o, "https://hooks.example/x", 5, unkeyed, 1).body,
            R"({"id":42,"event_id":7,"topic":"order.created","key":null,"seq":null,)"
            R"("published_at":"2023-11-14T22:13:20.000Z","attempt":2,)"
            R"("headers":null,"payload":{"a": 1, "b": "\u20ac"}})");
  o.envelope = false;
  const HttpRequest bare = build_webhook_request(o, "https://hooks.example/x", 5, m, 1700000000);
  EXPECT_EQ(bare.body, m.payload_json);
  EXPECT_EQ(header(bare, "webhook-signature"), webhook_signature(o.secrets, "42", 1700000000, m.payload_json));
}

// webhook-id: the host's prefix (unique per database: the PostgreSQL side
// puts the system identifier and database oid in it, relaybus-mongo its own)
// and the delivery id, so it is the same on every retry of the delivery and
// differs between databases whose delivery ids coincide.
TEST(WebhookDelivery, WebhookIdIsPrefixedAndStableAcrossAttempts) {
  HandlerOptions o;
  std::string why;
  ASSERT_TRUE(
      parse_handler_options(HandlerKind::Http, R"({"secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})", &o, &why))
      << why;
  o.message_id_prefix = "msg_7312345678901234567_16384_";
  WebhookMessage m;
  m.id = 42;
  m.event_id = 7;
  m.topic = "t";
  m.payload_json = "{}";
  m.attempt = 1;
  const HttpRequest first = build_webhook_request(o, "https://h/x", 1, m, 1700000000);
  m.attempt = 2;
  const HttpRequest retry = build_webhook_request(o, "https://h/x", 1, m, 1700000060);
  EXPECT_EQ(header(first, "webhook-id"), "msg_7312345678901234567_16384_42");
  EXPECT_EQ(header(retry, "webhook-id"), header(first, "webhook-id"));
  EXPECT_EQ(first.tag, 42u);  // the engine's tag stays the delivery id
  // The signature covers the webhook-id as sent.
  EXPECT_EQ(header(first, "webhook-signature"),
            webhook_signature(o.secrets, "msg_7312345678901234567_16384_42", 1700000000, first.body));
  HandlerOptions other = o;
  other.message_id_prefix = "msg_7312345678901234567_16385_";
  EXPECT_NE(header(build_webhook_request(other, "https://h/x", 1, m, 1700000000), "webhook-id"),
            header(first, "webhook-id"));
}

// The envelope carries the event's publish time as RFC 3339 (UTC, milliseconds).
TEST(WebhookDelivery, EnvelopeCarriesPublishedAtAsRfc3339) {
  HandlerOptions o;
  WebhookMessage m;
  m.id = 1;
  m.event_id = 1;
  m.topic = "t";
  m.payload_json = "{}";
  m.published_at_ms = 1700000000123;
  auto j = nlohmann::json::parse(build_webhook_request(o, "https://h/x", 1, m, 1700000001).body);
  EXPECT_EQ(j["published_at"], "2023-11-14T22:13:20.123Z");
  m.published_at_ms = 86400000;  // 1970-01-02, zero-padded fields
  j = nlohmann::json::parse(build_webhook_request(o, "https://h/x", 1, m, 1).body);
  EXPECT_EQ(j["published_at"], "1970-01-02T00:00:00.000Z");
  EXPECT_EQ(format_rfc3339_ms(951782400000), "2000-02-29T00:00:00.000Z");  // leap day
  m.published_at_ms = 0;                                                   // unknown: null
  j = nlohmann::json::parse(build_webhook_request(o, "https://h/x", 1, m, 1).body);
  EXPECT_TRUE(j["published_at"].is_null());
}

TEST(WebhookDelivery, EnvelopeIsJsonWithNullsForUnkeyed) {
  std::string key = "order-\"42\"";
  auto j = nlohmann::json::parse(
      webhook_envelope_json(5, 4, "order.created", &key, 3, 1700000000000, 1, R"({"h":"v"})", R"({"id":42})"));
  EXPECT_EQ(j["id"], 5);
  EXPECT_EQ(j["event_id"], 4);
  EXPECT_EQ(j["topic"], "order.created");
  EXPECT_EQ(j["key"], key);
  EXPECT_EQ(j["seq"], 3);
  EXPECT_EQ(j["published_at"], "2023-11-14T22:13:20.000Z");
  EXPECT_EQ(j["attempt"], 1);
  EXPECT_EQ(j["headers"]["h"], "v");
  EXPECT_EQ(j["payload"]["id"], 42);
  auto u = nlohmann::json::parse(webhook_envelope_json(6, 6, "t", nullptr, std::nullopt, 0, 2, "", "[1,2]"));
  EXPECT_TRUE(u["key"].is_null());
  EXPECT_TRUE(u["seq"].is_null());
  EXPECT_TRUE(u["headers"].is_null());
  EXPECT_EQ(u["payload"][1], 2);
}

TEST(WebhookDelivery, FailureDecisions) {
  HandlerOptions o;
  o.max_attempts = 3;
  o.backoff_base_ms = 1000;
  o.backoff_max_ms = 60000;
  HttpResult r;
  r.outcome = HttpOutcome::Fail;
  r.status = 404;
  EXPECT_TRUE(webhook_failure_is_permanent(o, r));
  o.retry_4xx = true;
  EXPECT_FALSE(webhook_failure_is_permanent(o, r));
  r.status = 0;  // refused address: always permanent
  EXPECT_TRUE(webhook_failure_is_permanent(o, r));
  r.outcome = HttpOutcome::Retry;
  r.status = 500;
  EXPECT_FALSE(webhook_failure_is_permanent(o, r));

  FailureDecision d = decide_failure(o, false, 1, -1, 123456789);
  EXPECT_FALSE(d.dead);
  EXPECT_GE(d.retry_in_ms, 0);
  EXPECT_LE(d.retry_in_ms, 1000);
  d = decide_failure(o, false, 2, 7000, 0);  // Retry-After wins
  EXPECT_FALSE(d.dead);
  EXPECT_EQ(d.retry_in_ms, 7000);
  EXPECT_TRUE(decide_failure(o, false, 3, -1, 0).dead);  // max_attempts reached
  EXPECT_TRUE(decide_failure(o, true, 1, -1, 0).dead);
}

TEST(WebhookDelivery, CircuitBreakerOpensAfterFiveNetworkFailuresAndClosesOnSuccess) {
  HandlerOptions o;
  o.backoff_base_ms = 1000;
  o.backoff_max_ms = 3000;
  CircuitBreaker b;
  HttpResult fail;
  fail.outcome = HttpOutcome::Retry;
  fail.status = 503;
  for (int i = 0; i < 4; i++) b.record(fail, o, 0);
  EXPECT_FALSE(b.is_open());
  EXPECT_EQ(b.limit(16, 0), 16);
  HttpResult notfound;
  notfound.outcome = HttpOutcome::Fail;
  notfound.status = 404;
  b.record(notfound, o, 0);  // a 4xx is the request's fault, not the endpoint's
  EXPECT_FALSE(b.is_open());
  b.record(fail, o, 0);
  EXPECT_TRUE(b.is_open());
  EXPECT_EQ(b.open_until_ms(), 1000);
  EXPECT_EQ(b.limit(16, 999), 0);
  b.record(fail, o, 500);  // in flight when it opened: no longer backoff
  EXPECT_EQ(b.open_until_ms(), 1000);
  EXPECT_EQ(b.limit(16, 1000), 1);
  b.record(fail, o, 1000);  // the probe failed: open again, longer
  EXPECT_EQ(b.open_until_ms(), 3000);
  b.record(fail, o, 3000);
  EXPECT_EQ(b.open_until_ms(), 6000);  // capped at backoff_max
  HttpResult ok;
  ok.outcome = HttpOutcome::Success;
  ok.status = 200;
  b.record(ok, o, 6000);
  EXPECT_FALSE(b.is_open());
  EXPECT_EQ(b.limit(16, 6000), 16);
}

TEST(WebhookDelivery, EnvelopeStringsAreEscapedAsJson) {
  // Plain topics and keys are copied; anything else is written the way
  // nlohmann's dump writes it (escapes, UTF-8 as is, invalid UTF-8 replaced).
  const std::string cases[] = {
      "order.created",          "",     "a b~",        "quote\"d",   "back\\slash", "tab\there", "nl\n",
      std::string("nul\0x", 5), "\x7f", "caf\xc3\xa9", "bad\xff\xfe"};
  for (const std::string& s : cases) {
    const std::string expected = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    const std::string env = webhook_envelope_json(1, 1, s, &s, 1, 0, 1, "", "1");
    EXPECT_NE(env.find("\"topic\":" + expected + ",\"key\":" + expected + ","), std::string::npos) << env;
    EXPECT_TRUE(nlohmann::json::accept(env)) << env;
  }
}
