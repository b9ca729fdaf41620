#include "core/cloudevents.hpp"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "core/webhook_signature.hpp"
#include "request_header.hpp"

using namespace relaybus::core;

namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;

HandlerOptions options(HandlerKind kind, const char* json) {
  HandlerOptions o;
  std::string why;
  EXPECT_TRUE(parse_handler_options(kind, json, &o, &why)) << why;
  o.message_id_prefix = "msg_1_2_";
  o.default_cloudevents_source = default_cloudevents_source("/relaybus/", "shop");
  return o;
}

// Fields in WebhookMessage's order: id, event_id, topic, has_key, key, seq,
// published_at_ms, attempt, headers_json, payload_json.
WebhookMessage keyed() {
  return WebhookMessage{
      42, 7, "order.created", true, "cust 9/ü", 3, 1700000000123, 2, R"({"x":"y"})", R"({"total":12.5})", {}};
}

WebhookMessage unkeyed() {
  WebhookMessage m = keyed();
  m.has_key = false;
  m.key.clear();
  m.seq = 0;
  m.attempt = 1;
  return m;
}

Headers without_webhook_headers(const HttpRequest& r) {
  Headers out;
  for (const auto& kv : r.headers)
    if (kv.first.rfind("webhook-", 0) != 0) out.push_back(kv);
  return out;
}

}  // namespace

TEST(CloudEvents, DefaultSourcePercentEncodesTheDatabaseName) {
  EXPECT_EQ(default_cloudevents_source("/relaybus/", "shop_db-1.x~"), "/relaybus/shop_db-1.x~");
  EXPECT_EQ(default_cloudevents_source("/relaybus-mongo/", "my shop/ü"), "/relaybus-mongo/my%20shop%2F%C3%BC");
}

TEST(CloudEvents, HttpBinaryModeHeadersAndBody) {
  const HandlerOptions o =
      options(HandlerKind::Http, R"({"cloudevents":"binary","headers":{"CE-Id":"forged","x-team":"a"}})");
  const HttpRequest r = build_webhook_request(o, "http://h/x", 1, keyed(), 1700000001);
  EXPECT_EQ(r.body, R"({"total":12.5})");
  const Headers want = {{"x-team", "a"},
                        {"content-type", "application/json"},
                        {"ce-specversion", "1.0"},
                        {"ce-id", "7"},
                        {"ce-source", "/relaybus/shop"},
                        {"ce-type", "order.created"},
                        {"ce-subject", "cust%209/%C3%BC"},
                        {"ce-time", "2023-11-14T22:13:20.123Z"},
                        {"ce-relaybusseq", "3"},
                        {"ce-relaybusattempt", "2"}};
  EXPECT_EQ(without_webhook_headers(r), want);
  EXPECT_EQ(header(r, "webhook-id"), "msg_1_2_42");

  const HttpRequest u = build_webhook_request(o, "http://h/x", 1, unkeyed(), 1700000001);
  const Headers want_unkeyed = {{"x-team", "a"},
                                {"content-type", "application/json"},
                                {"ce-specversion", "1.0"},
                                {"ce-id", "7"},
                                {"ce-source", "/relaybus/shop"},
                                {"ce-type", "order.created"},
                                {"ce-time", "2023-11-14T22:13:20.123Z"},
                                {"ce-relaybusattempt", "1"}};
  EXPECT_EQ(without_webhook_headers(u), want_unkeyed);
}

TEST(CloudEvents, HttpStructuredModeBody) {
  const HandlerOptions o =
      options(HandlerKind::Http, R"({"cloudevents":"structured","cloudevents_source":"urn:example:shop"})");
  const HttpRequest r = build_webhook_request(o, "http://h/x", 1, keyed(), 1700000001);
  EXPECT_EQ(without_webhook_headers(r), (Headers{{"content-type", "application/cloudevents+json"}}));
  EXPECT_EQ(r.body, R"({"specversion":"1.0","id":"7","source":"urn:example:shop","type":"order.created",)"
                    R"("subject":"cust 9/ü","time":"2023-11-14T22:13:20.123Z","datacontenttype":"application/json",)"
                    R"("relaybusseq":3,"relaybusattempt":2,"data":{"total":12.5}})");
  WebhookMessage m = unkeyed();
  m.published_at_ms = 0;
  m.payload_json.clear();
  m.topic = "a\"b";
  EXPECT_EQ(build_webhook_request(o, "http://h/x", 1, m, 1).body,
            R"({"specversion":"1.0","id":"7","source":"urn:example:shop","type":"a\"b",)"
            R"("datacontenttype":"application/json","relaybusattempt":1,"data":null})");
}

// Standard Webhooks still apply: the signature is over the bytes sent, the
// CloudEvent's, and webhook-id stays the delivery's.
TEST(CloudEvents, SignatureCoversTheCloudEventBody) {
  for (const char* mode : {"binary", "structured"}) {
    const HandlerOptions o = options(
        HandlerKind::Http,
        (std::string(R"({"secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",)") + R"("cloudevents":")" + mode + R"("})")
            .c_str());
    const HttpRequest r = build_webhook_request(o, "http://h/x", 1, keyed(), 1700000001);
    EXPECT_EQ(header(r, "webhook-id"), "msg_1_2_42") << mode;
    EXPECT_EQ(header(r, "webhook-timestamp"), "1700000001") << mode;
    EXPECT_EQ(header(r, "webhook-signature"), webhook_signature(o.secrets, "msg_1_2_42", 1700000001, r.body)) << mode;
    EXPECT_NE(header(r, "webhook-signature"), webhook_signature(o.secrets, "msg_1_2_42", 1700000001, "{}")) << mode;
  }
}

TEST(CloudEvents, KafkaBinaryModeHeadersAsTheyAre) {
  const HandlerOptions o = options(HandlerKind::Kafka, R"({"cloudevents":"binary"})");
  const CloudEventMessage ce = make_cloudevent(o, keyed(), CloudEventsBinding::Kafka);
  EXPECT_EQ(ce.body, R"({"total":12.5})");
  const Headers want = {
      {"content-type", "application/json"},    {"ce_specversion", "1.0"},    {"ce_id", "7"},
      {"ce_source", "/relaybus/shop"},         {"ce_type", "order.created"}, {"ce_subject", "cust 9/ü"},
      {"ce_time", "2023-11-14T22:13:20.123Z"}, {"ce_relaybusseq", "3"},      {"ce_relaybusattempt", "2"}};
  EXPECT_EQ(ce.headers, want);
}

TEST(CloudEvents, KafkaStructuredModeIsTheJsonEvent) {
  const HandlerOptions o = options(HandlerKind::Kafka, R"({"cloudevents":"structured"})");
  const CloudEventMessage ce = make_cloudevent(o, unkeyed(), CloudEventsBinding::Kafka);
  EXPECT_EQ(ce.headers, (Headers{{"content-type", "application/cloudevents+json"}}));
  EXPECT_EQ(ce.body, R"({"specversion":"1.0","id":"7","source":"/relaybus/shop","type":"order.created",)"
                     R"("time":"2023-11-14T22:13:20.123Z","datacontenttype":"application/json","relaybusattempt":1,)"
                     R"("data":{"total":12.5}})");
}

TEST(CloudEvents, OptionsAreListedOnlyWhenSet) {
  const HandlerOptions o =
      options(HandlerKind::Http, R"({"cloudevents":"binary","cloudevents_source":"/s","envelope":false})");
  const std::string j = options_public_json(HandlerKind::Http, o);
  EXPECT_NE(j.find(R"("cloudevents":"binary","cloudevents_source":"/s")"), std::string::npos) << j;
  EXPECT_EQ(options_public_json(HandlerKind::Http, HandlerOptions{}).find("cloudevents"), std::string::npos);
}
